#!/usr/bin/env bash
# Lists the longest Rust functions under the given paths: lines from the `fn` line to its
# closing brace, inclusive, largest first.
#
#   scripts/fn-sizes.sh [-n COUNT] [--tests] PATH...
#   scripts/fn-sizes.sh -n 10 crates/transport/src crates/daemon/src
#
# Brace counting, not parsing: string and char literals and `//` comments are blanked
# before counting, which is enough for this code base (no raw strings with unbalanced
# braces, no block comments holding code). `#[cfg(test)] mod ... { }` bodies are skipped
# unless --tests is given (out-of-line test modules are files: leave them out by path).
# Declarations without a body (trait methods) are not listed.
set -euo pipefail

count=20
tests=0
paths=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) count="$2"; shift 2 ;;
    --tests) tests=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) paths+=("$1"); shift ;;
  esac
done
[ ${#paths[@]} -gt 0 ] || paths=(crates)

find "${paths[@]}" -name '*.rs' -type f -print0 | sort -z | xargs -0 awk -v tests="$tests" '
FNR == 1 { depth = 0; infn = 0; skipping = 0; cfgtest = 0 }
{
  line = $0
  gsub(/\\\\/, "", line)                  # escaped backslashes
  gsub(/\\"/, "", line)                   # escaped quotes
  gsub(/'"'"'\\?.'"'"'/, "", line)        # char literals such as '"'"'{'"'"' or '"'"'\n'"'"'
  gsub(/"[^"]*"/, "\"\"", line)           # string literals
  sub(/\/\/.*/, "", line)                 # line comments

  if (!tests && line ~ /#\[cfg\(test\)\]/) { cfgtest = 1 }
  if (cfgtest && !skipping && line ~ /(^|[^A-Za-z0-9_])mod [A-Za-z0-9_]+[ ]*\{/) {
    skipping = 1; skipbase = depth; cfgtest = 0
  } else if (cfgtest && line !~ /^[ \t]*(#|$)/) {
    cfgtest = 0
  }

  if (!infn && !skipping && match(line, /(^|[^A-Za-z0-9_])fn [A-Za-z_][A-Za-z0-9_]*/)) {
    name = substr(line, RSTART, RLENGTH)
    sub(/^.*fn /, "", name)
    infn = 1; opened = 0; base = depth; start = FNR
  }

  n = length(line)
  for (i = 1; i <= n; i++) {
    c = substr(line, i, 1)
    if (c == "{") {
      depth++
      if (infn && !opened && depth == base + 1) opened = 1
    } else if (c == "}") {
      depth--
      if (infn && opened && depth == base) {
        printf "%d\t%s:%d\t%s\n", FNR - start + 1, FILENAME, start, name
        infn = 0
      }
      if (skipping && depth == skipbase) skipping = 0
    } else if (c == ";" && infn && !opened && depth == base) {
      infn = 0
    }
  }
}
' | sort -t$'\t' -k1,1nr | head -n "$count"
