//! The argument shape of `cluster exec`: ssh's, so MPI launchers can use it as their
//! remote-shell agent.
//!
//! Open MPI's rsh launcher runs `AGENT [options] HOST orted ARGS...` and hydra's ssh
//! launcher `AGENT [-x] HOST proxy ARGS...`; both quote the remote command for a shell, as
//! ssh(1) joins its command words with spaces and hands the string to the remote user's shell.
//! So, like ssh: ssh(1)'s options are accepted and ignored (they concern the connection), an
//! optional `user@` is dropped, and the words after HOST are joined and run by `/bin/sh -c`.
//! Beyond ssh, `HOST -- PROGRAM ARGS...` runs PROGRAM with exactly these arguments, no shell.

use std::ffi::{OsStr, OsString};

/// ssh(1) options that take a value (`-p 22` or `-p22`): from its synopsis.
const WITH_VALUE: &[u8] = b"BbcDEeFIiJLlmOoPpQRSWw";

/// What to run, and where.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    pub host: String,
    pub command: Command,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `HOST -- PROGRAM ARGS...`: exactly this argv.
    Argv(Vec<OsString>),
    /// `HOST WORDS...`: the words joined by spaces, for `sh -c` (ssh's way).
    Shell(OsString),
    /// `HOST` alone: an interactive shell.
    Login,
}

pub fn parse(args: &[OsString]) -> Result<Invocation, String> {
    let mut i = 0;
    while let Some(a) = args.get(i).and_then(|a| a.to_str()) {
        let Some(opts) = a.strip_prefix('-') else {
            break;
        };
        if opts.is_empty() || a == "--" {
            return Err(format!(
                "{a}: expected a host name (cluster exec [ssh options] HOST [--] COMMAND...)"
            ));
        }
        i += 1;
        // A group of flags (`-xT`), possibly ending in one that takes a value, attached
        // (`-oBatchMode=yes`) or as the next word (`-o BatchMode=yes`).
        for (k, b) in opts.bytes().enumerate() {
            if WITH_VALUE.contains(&b) {
                if k + 1 == opts.len() {
                    if i >= args.len() {
                        return Err(format!("-{}: needs a value", b as char));
                    }
                    i += 1;
                }
                break;
            }
        }
    }
    let Some(host) = args.get(i) else {
        return Err("no host (cluster exec [ssh options] HOST [--] COMMAND...)".into());
    };
    let host = host
        .to_str()
        .ok_or_else(|| format!("{}: not a host name", host.to_string_lossy()))?;
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h).to_string();
    let rest = &args[i + 1..];
    let command = match rest.split_first() {
        None => Command::Login,
        Some((first, argv)) if first == "--" => {
            if argv.is_empty() {
                return Err(format!("{host} --: nothing to run"));
            }
            Command::Argv(argv.to_vec())
        }
        Some(_) => {
            let mut line = OsString::new();
            for (k, w) in rest.iter().enumerate() {
                if k > 0 {
                    line.push(" ");
                }
                line.push(w);
            }
            Command::Shell(line)
        }
    };
    Ok(Invocation { host, command })
}

/// The environment an ssh login would give the command (what the caller's session had that a
/// login shell also sets); everything else the launchers pass on their own command lines.
pub fn kept_variable(name: &OsStr) -> bool {
    const KEPT: &[&str] = &[
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "TMPDIR", "TZ",
    ];
    name.to_str().is_some_and(|n| KEPT.contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn open_mpi_and_hydra_argument_shapes() {
        // Open MPI's rsh launcher (plm_rsh_module.c) and hydra's ssh launcher (-x first).
        let inv = parse(&args(&["sv5a-2", "orted", "-mca", "ess", "\"env\""])).unwrap();
        assert_eq!(inv.host, "sv5a-2");
        assert_eq!(inv.command, Command::Shell("orted -mca ess \"env\"".into()));
        let inv = parse(&args(&[
            "-x",
            "sv5a-1",
            "\"/usr/bin/hydra_pmi_proxy\"",
            "--control-port",
            "h:1",
        ]))
        .unwrap();
        assert_eq!(inv.host, "sv5a-1");
        assert_eq!(
            inv.command,
            Command::Shell("\"/usr/bin/hydra_pmi_proxy\" --control-port h:1".into())
        );
    }

    #[test]
    fn ssh_options_with_values_and_user_at_host() {
        let inv = parse(&args(&[
            "-o",
            "BatchMode=yes",
            "-p22",
            "-xT",
            "-l",
            "me",
            "root@sv5a-1",
            "true",
        ]))
        .unwrap();
        assert_eq!(inv.host, "sv5a-1");
        assert_eq!(inv.command, Command::Shell("true".into()));
        let inv = parse(&args(&["-oStrictHostKeyChecking=no", "sv5a-1"])).unwrap();
        assert_eq!(inv.command, Command::Login);
    }

    #[test]
    fn double_dash_keeps_the_argv() {
        let inv = parse(&args(&["sv5a-1", "--", "printf", "%s\\n", "a b"])).unwrap();
        assert_eq!(
            inv.command,
            Command::Argv(args(&["printf", "%s\\n", "a b"]))
        );
        assert!(parse(&args(&["sv5a-1", "--"])).is_err());
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(parse(&args(&[])).is_err());
        assert!(parse(&args(&["-p"])).is_err());
        assert!(parse(&args(&["-x"])).is_err());
        assert!(parse(&args(&["--", "ls"])).is_err());
    }
}
