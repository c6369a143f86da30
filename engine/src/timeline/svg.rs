//! A timeline drawn as one self-contained SVG (no script, no font file, no
//! link): a lane per host with a bar per step coloured by phase, waits
//! hatched, the time a ready step queued for its host as a thin line, the
//! critical path outlined, and the preamble on a lane of its own. Past
//! [`FOLD_AT`] hosts, lanes fold into one row per phase showing how many
//! hosts were in that phase at each moment, with the critical path's steps
//! still drawn, so 500 hosts read as well as 5 and the file stays small.
//! Every bar carries a `<title>` (a tooltip in a browser) and `data-`
//! attributes naming its step, host and phase.

use std::fmt::Write as _;

use super::{Bar, PREAMBLE, SLACK_MS, Timeline, secs};

/// Hosts above which lanes fold into phase rows.
pub const FOLD_AT: usize = 40;

/// Where things are drawn: exposed so a test can check a bar against its times.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub label_w: f64,
    pub plot_w: f64,
    pub top: f64,
    pub lane_h: f64,
    pub lane_gap: f64,
    pub total_ms: i64,
}

impl Geometry {
    pub fn of(t: &Timeline) -> Geometry {
        Geometry {
            label_w: 190.0,
            plot_w: 1000.0,
            top: 92.0,
            lane_h: 16.0,
            lane_gap: 3.0,
            total_ms: t.total_ms.max(1),
        }
    }

    /// The x of a time (milliseconds from the origin).
    pub fn x(&self, ms: i64) -> f64 {
        self.label_w + ms as f64 * self.plot_w / self.total_ms as f64
    }

    /// The top of lane `i`.
    pub fn lane_y(&self, i: usize) -> f64 {
        self.top + i as f64 * (self.lane_h + self.lane_gap)
    }
}

/// Fill colours of phases, in the order phases first appear.
const PALETTE: &[&str] = &[
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#8cd17d", "#d37295", "#86bcb6",
];
const PREAMBLE_FILL: &str = "#9a9a9a";

/// The SVG of a timeline.
pub fn render(t: &Timeline) -> String {
    let g = Geometry::of(t);
    let folded = t.hosts.len() > FOLD_AT;
    let rows: Vec<String> = if folded { t.phases.clone() } else { t.hosts.clone() };
    let has_preamble = !t.preamble.is_empty();
    let lanes = rows.len() + usize::from(has_preamble);
    let height = g.lane_y(lanes) + 30.0;
    let width = g.label_w + g.plot_w + 30.0;
    let mut s = String::with_capacity(64 * 1024);
    let _ = write!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">
<defs><pattern id="wait" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#ffffff" fill-opacity="0.6"/></pattern></defs>
<rect width="100%" height="100%" fill="#ffffff"/>
"##
    );
    header(&mut s, t);
    legend(&mut s, t);
    axis(&mut s, &g, height - 24.0);
    let mut lane = 0;
    if has_preamble {
        label(&mut s, &g, lane, "kubexm (preamble)");
        for p in &t.preamble {
            let title = format!("{}: {} (from {})", p.name, secs(p.end_ms - p.start_ms), secs(p.start_ms));
            let mark = Mark {
                span: (p.start_ms, p.end_ms),
                fill: PREAMBLE_FILL,
                stroke: "",
                title: &title,
                attrs: &[("span", &p.name)],
                class: "span",
            };
            mark.draw(&mut s, &g, lane);
        }
        lane += 1;
    }
    if folded {
        for phase in &rows {
            let hosts = t
                .steps
                .iter()
                .filter(|b| &b.phase == phase)
                .map(|b| b.host.as_str())
                .collect::<std::collections::HashSet<_>>()
                .len();
            label(&mut s, &g, lane, &format!("{phase} ({hosts} hosts)"));
            density(&mut s, t, &g, lane, phase, hosts);
            for b in t.steps.iter().filter(|b| b.critical && &b.phase == phase) {
                bar(&mut s, t, &g, lane, b);
            }
            lane += 1;
        }
    } else {
        for host in &rows {
            label(&mut s, &g, lane, host);
            for b in t.steps.iter().filter(|b| &b.host == host) {
                bar(&mut s, t, &g, lane, b);
            }
            lane += 1;
        }
    }
    s.push_str("</svg>\n");
    s
}

fn header(s: &mut String, t: &Timeline) {
    let _ = writeln!(
        s,
        r##"<text x="10" y="20" font-size="14" font-weight="bold">kubexm job {}: {} of cluster {} ({}), {} on {} hosts</text>"##,
        t.job,
        esc(&t.kind),
        esc(&t.cluster),
        esc(&t.status),
        secs(t.total_ms),
        t.hosts.len()
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="38">critical path by phase: {}</text>"##,
        esc(&t.critical_by_phase())
    );
}

/// The phases' colours, and what the marks mean.
fn legend(s: &mut String, t: &Timeline) {
    let mut x = 10.0;
    let y = 50.0;
    let mut item = |s: &mut String, fill: &str, extra: &str, text: &str| {
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{y}" width="12" height="10" fill="{fill}"{extra}/><text x="{:.1}" y="{}">{}</text>"##,
            x + 15.0,
            y + 9.0,
            esc(text)
        );
        x += 22.0 + 6.5 * text.chars().count() as f64;
    };
    item(s, PREAMBLE_FILL, "", PREAMBLE);
    for (i, p) in t.phases.iter().enumerate() {
        item(s, PALETTE[i % PALETTE.len()], "", p);
    }
    let y2 = y + 16.0;
    let _ = writeln!(
        s,
        r##"<rect x="10" y="{y2}" width="12" height="10" fill="#777777"/><rect x="10" y="{y2}" width="12" height="10" fill="url(#wait)"/><text x="25" y="{}">waiting (hatched)</text>
<rect x="140" y="{y2}" width="12" height="10" fill="#dddddd" stroke="#000000" stroke-width="1.5"/><text x="155" y="{}">critical path (outlined)</text>
<line x1="300" y1="{}" x2="318" y2="{}" stroke="#555555" stroke-width="1"/><text x="323" y="{}">ready, queued for its host</text>"##,
        y2 + 9.0,
        y2 + 9.0,
        y2 + 5.0,
        y2 + 5.0,
        y2 + 9.0
    );
}

/// The time axis: a grid line and a label at each tick.
fn axis(s: &mut String, g: &Geometry, bottom: f64) {
    let step = tick_step(g.total_ms);
    let mut ms = 0;
    while ms <= g.total_ms {
        let x = g.x(ms);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.2}" y1="{:.1}" x2="{x:.2}" y2="{bottom:.1}" stroke="#e4e4e4"/><text x="{x:.2}" y="{:.1}" text-anchor="middle" fill="#555555">{}</text>"##,
            g.top - 4.0,
            bottom + 14.0,
            tick_label(ms, step)
        );
        ms += step;
    }
}

/// A tick every 1, 2 or 5 × 10^k milliseconds, at most 12 of them.
fn tick_step(total_ms: i64) -> i64 {
    let mut unit = 1;
    loop {
        for m in [1, 2, 5] {
            if total_ms / (unit * m) <= 12 {
                return unit * m;
            }
        }
        unit *= 10;
    }
}

fn tick_label(ms: i64, step: i64) -> String {
    if step >= 1000 {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

fn label(s: &mut String, g: &Geometry, lane: usize, text: &str) {
    let _ = writeln!(
        s,
        r##"<text class="lane" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
        g.label_w - 6.0,
        g.lane_y(lane) + g.lane_h - 4.0,
        esc(text)
    );
}

/// A step's bar on `lane`: its queue time as a line, the bar in its
/// phase's colour, hatched when it waits, outlined when critical.
fn bar(s: &mut String, t: &Timeline, g: &Geometry, lane: usize, b: &Bar) {
    let fill = phase_fill(t, &b.phase);
    if b.start_ms - b.ready_ms > SLACK_MS {
        let y = g.lane_y(lane) + g.lane_h / 2.0;
        let _ = writeln!(
            s,
            r##"<line class="queued" x1="{:.2}" y1="{y:.1}" x2="{:.2}" y2="{y:.1}" stroke="#555555" stroke-width="1"/>"##,
            g.x(b.ready_ms),
            g.x(b.start_ms)
        );
    }
    let stroke = match (b.outcome.as_str(), b.critical) {
        ("failed", _) => r##" stroke="#d00000" stroke-width="2""##,
        (_, true) => r##" stroke="#000000" stroke-width="1.5""##,
        _ => "",
    };
    let waits = b.waits.as_deref().map(|w| format!(", waiting for {w}")).unwrap_or_default();
    let title = format!(
        "{}: {} ({}{waits}); ready at {}, started at {}",
        b.id,
        secs(b.duration_ms()),
        b.outcome,
        secs(b.ready_ms),
        secs(b.start_ms)
    );
    let class = if b.critical { "bar critical" } else { "bar" };
    let attrs = [("id", b.id.as_str()), ("host", b.host.as_str()), ("phase", b.phase.as_str())];
    let mark = Mark {
        span: (b.start_ms, b.end_ms),
        fill,
        stroke,
        title: &title,
        attrs: &attrs,
        class,
    };
    mark.draw(s, g, lane);
    // The step's name inside its bar, where it fits.
    let name = b.id.rsplit('/').next().unwrap_or(&b.id).split('@').next().unwrap_or_default();
    let (x, w) = span_x(g, b.start_ms, b.end_ms);
    if w > 6.2 * name.chars().count() as f64 + 6.0 {
        let _ = writeln!(
            s,
            r##"<text class="label" x="{:.2}" y="{:.1}" fill="#ffffff" pointer-events="none">{}</text>"##,
            x + 3.0,
            g.lane_y(lane) + g.lane_h - 4.0,
            esc(name)
        );
    }
    if b.waits.is_some() {
        let (x, w) = span_x(g, b.start_ms, b.end_ms);
        let _ = writeln!(
            s,
            r##"<rect class="wait" x="{x:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="url(#wait)" pointer-events="none"/>"##,
            g.lane_y(lane),
            g.lane_h
        );
    }
}

/// A bar or a span: where, how it looks, its tooltip and data attributes.
struct Mark<'a> {
    span: (i64, i64),
    fill: &'a str,
    stroke: &'a str,
    title: &'a str,
    attrs: &'a [(&'a str, &'a str)],
    class: &'a str,
}

impl Mark<'_> {
    fn draw(&self, s: &mut String, g: &Geometry, lane: usize) {
        let (x, w) = span_x(g, self.span.0, self.span.1);
        let _ = write!(s, r##"<rect class="{}""##, self.class);
        for (k, v) in self.attrs {
            let _ = write!(s, r##" data-{k}="{}""##, esc(v));
        }
        let _ = writeln!(
            s,
            r##" x="{x:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{}"{}><title>{}</title></rect>"##,
            g.lane_y(lane),
            g.lane_h,
            self.fill,
            self.stroke,
            esc(self.title)
        );
    }
}

/// A span's x and width (at least half a pixel, so a short step shows).
fn span_x(g: &Geometry, from: i64, to: i64) -> (f64, f64) {
    let x = g.x(from);
    (x, (g.x(to) - x).max(0.5))
}

/// A folded phase row: the share of the phase's hosts running one of its
/// steps, per slice of the axis, as the height of a column.
fn density(s: &mut String, t: &Timeline, g: &Geometry, lane: usize, phase: &str, hosts: usize) {
    const SLICES: usize = 500;
    let mut running = vec![0u32; SLICES];
    let per_slice = (g.total_ms as f64 / SLICES as f64).max(1.0);
    for b in t.steps.iter().filter(|b| b.phase == phase) {
        let from = (b.start_ms as f64 / per_slice) as usize;
        let to = ((b.end_ms as f64 / per_slice).ceil() as usize).max(from + 1);
        for r in &mut running[from.min(SLICES)..to.min(SLICES)] {
            *r += 1;
        }
    }
    let fill = phase_fill(t, phase);
    let w = g.plot_w / SLICES as f64;
    let base = g.lane_y(lane) + g.lane_h;
    for (i, &n) in running.iter().enumerate().filter(|(_, n)| **n > 0) {
        let h = g.lane_h * (n as f64 / hosts.max(1) as f64).min(1.0);
        let _ = writeln!(
            s,
            r##"<rect class="load" x="{:.2}" y="{:.2}" width="{w:.2}" height="{h:.2}" fill="{fill}"/>"##,
            g.label_w + i as f64 * w,
            base - h
        );
    }
}

fn phase_fill<'a>(t: &Timeline, phase: &str) -> &'a str {
    if phase == PREAMBLE {
        return PREAMBLE_FILL;
    }
    t.phases
        .iter()
        .position(|p| p == phase)
        .map(|i| PALETTE[i % PALETTE.len()])
        .unwrap_or(PREAMBLE_FILL)
}

/// Text made safe for XML content and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // XML 1.0 allows no other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}
