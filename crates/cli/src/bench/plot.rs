//! A hand-made SVG of `bench lat|bw` results: latency and bandwidth against message size,
//! both axes logarithmic, one line per (operation, transport, daemons).

use std::fmt::Write;

use super::{human_size, name, Mode, Row};

const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const GAP: f64 = 90.0;
const LEGEND_H: f64 = 20.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

fn series_key(r: &Row) -> String {
    format!(
        "{} {}{}",
        name(r.op).to_uppercase(),
        name(r.transport).to_uppercase(),
        if r.daemons == 2 { " (2 daemons)" } else { "" }
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Decade bounds around `lo..hi` (positive values).
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    (lo, hi)
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

struct Panel<'a> {
    x0: f64,
    title: &'a str,
    ylabel: &'a str,
    series: Vec<(String, Vec<(f64, f64)>)>,
}

fn draw(out: &mut String, p: &Panel<'_>, colors: &[(String, &str)]) {
    let pts = p.series.iter().flat_map(|s| s.1.iter().copied());
    let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts.filter(|&(x, y)| x > 0.0 && y > 0.0) {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymin = ymin.min(y);
        ymax = ymax.max(y);
    }
    if xmin > xmax {
        return;
    }
    let (xl, xh) = (
        xmin.log2().floor(),
        xmax.log2().ceil().max(xmin.log2().floor() + 1.0),
    );
    let (yl, yh) = decades(ymin, ymax);
    let (yl, yh) = (yl.log10(), yh.log10());
    let sx = |x: f64| p.x0 + (x.log2() - xl) / (xh - xl) * PANEL_W;
    let sy = |y: f64| TOP + PANEL_H - (y.log10() - yl) / (yh - yl) * PANEL_H;
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#444"/>"##,
        p.x0
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
        p.x0 + PANEL_W / 2.0,
        TOP - 12.0,
        esc(p.title)
    );
    // x grid: every power of two, labels on every other one.
    let mut e = xl as i32;
    while e <= xh as i32 {
        let x = sx(2f64.powi(e));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#ddd"/>"##,
            TOP + PANEL_H
        );
        if (e - xl as i32) % 2 == 0 {
            let label = human_size(1usize << e.max(0)).replace(" ", "\u{a0}");
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle" font-size="11">{label}</text>"#,
                TOP + PANEL_H + 16.0
            );
        }
        e += 1;
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">message size</text>"#,
        p.x0 + PANEL_W / 2.0,
        TOP + PANEL_H + 36.0
    );
    // y grid: decades, with 2 and 5 in between unlabelled.
    let mut d = yl as i32;
    while d <= yh as i32 {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(d);
            if v.log10() > yh + 1e-9 {
                continue;
            }
            let y = sy(v);
            let stroke = if m == 1.0 { "#ccc" } else { "#eee" };
            let _ = writeln!(
                out,
                r#"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="{stroke}"/>"#,
                p.x0,
                p.x0 + PANEL_W
            );
            if m == 1.0 {
                let _ = writeln!(
                    out,
                    r#"<text x="{}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"#,
                    p.x0 - 6.0,
                    y + 4.0,
                    fmt_num(v)
                );
            }
        }
        d += 1;
    }
    let _ = writeln!(
        out,
        r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle" font-size="12">{}</text>"#,
        p.x0 - 50.0,
        TOP + PANEL_H / 2.0,
        esc(p.ylabel)
    );
    for (key, pts) in &p.series {
        let color = colors.iter().find(|c| &c.0 == key).map_or("#000", |c| c.1);
        let path: Vec<String> = pts
            .iter()
            .filter(|&&(x, y)| x > 0.0 && y > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for pt in &path {
            let (x, y) = pt.split_once(',').expect("x,y");
            let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
        }
    }
}

fn series(
    rows: &[Row],
    mode: Mode,
    value: impl Fn(&Row) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows.iter().filter(|r| r.mode == mode) {
        let Some(v) = value(r) else { continue };
        let key = series_key(r);
        match out.iter_mut().find(|s| s.0 == key) {
            Some(s) => s.1.push((r.size as f64, v)),
            None => out.push((key, vec![(r.size as f64, v)])),
        }
    }
    for s in &mut out {
        s.1.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The SVG document for `rows` (a latency panel if any row is a latency run, a bandwidth panel
/// if any is a bandwidth run).
pub fn svg(rows: &[Row]) -> String {
    let lat = series(rows, Mode::Lat, |r| r.median_us);
    let bw = series(rows, Mode::Bw, |r| Some(r.mb_s));
    let mut panels = Vec::new();
    if !lat.is_empty() {
        panels.push(("median one-way latency", "µs (log)", lat));
    }
    if !bw.is_empty() {
        panels.push(("bandwidth", "MB/s (log)", bw));
    }
    let mut keys: Vec<String> = Vec::new();
    for (_, _, s) in &panels {
        for (k, _) in s {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let colors: Vec<(String, &str)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), COLORS[i % COLORS.len()]))
        .collect();
    let n = panels.len().max(1) as f64;
    let legend_rows = keys.len().div_ceil(3).max(1) as f64;
    let width = LEFT + n * PANEL_W + (n - 1.0) * GAP + 30.0;
    let height = TOP + PANEL_H + BOTTOM + legend_rows * LEGEND_H + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, (title, ylabel, s)) in panels.into_iter().enumerate() {
        let p = Panel {
            x0: LEFT + i as f64 * (PANEL_W + GAP),
            title,
            ylabel,
            series: s,
        };
        draw(&mut out, &p, &colors);
    }
    let ly = TOP + PANEL_H + BOTTOM + 15.0;
    for (i, (k, c)) in colors.iter().enumerate() {
        let x = LEFT + (i % 3) as f64 * 300.0;
        let y = ly + (i / 3) as f64 * LEGEND_H;
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            x + 24.0,
            x + 30.0,
            y + 4.0,
            esc(k)
        );
    }
    out.push_str("</svg>\n");
    out
}
