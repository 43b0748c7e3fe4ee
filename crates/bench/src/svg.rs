//! A very small SVG writer and the one chart `bench report` draws: every
//! run as a jittered dot over a box plot per group, with axes, ticks, labels
//! and a legend.

use std::fmt::Write;

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

/// An SVG document being built.
pub struct Svg {
    body: String,
    w: f64,
    h: f64,
}

impl Svg {
    pub fn new(w: f64, h: f64) -> Svg {
        Svg { body: String::new(), w, h }
    }

    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, class: &str) {
        let _ = writeln!(
            self.body,
            r#"<line class="{class}" x1="{x1:.2}" y1="{y1:.2}" x2="{x2:.2}" y2="{y2:.2}" stroke="{stroke}" stroke-width="1"/>"#
        );
    }

    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, class: &str) {
        let _ = writeln!(
            self.body,
            r#"<rect class="{class}" x="{x:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="{fill}" stroke="black" stroke-width="1"/>"#,
            w.max(0.0),
            h.max(0.0)
        );
    }

    pub fn circle(&mut self, cx: f64, cy: f64, r: f64, fill: &str, class: &str) {
        let _ = writeln!(
            self.body,
            r#"<circle class="{class}" cx="{cx:.2}" cy="{cy:.2}" r="{r:.1}" fill="{fill}" fill-opacity="0.7"/>"#
        );
    }

    /// `anchor`: start, middle or end; `rotate`: degrees around the anchor point.
    pub fn text(&mut self, x: f64, y: f64, size: f64, anchor: &str, rotate: f64, s: &str) {
        let tr = if rotate != 0.0 { format!(r#" transform="rotate({rotate} {x:.2} {y:.2})""#) } else { String::new() };
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.2}" y="{y:.2}" font-family="sans-serif" font-size="{size}" text-anchor="{anchor}"{tr}>{}</text>"#,
            escape(s)
        );
    }

    pub fn finish(self) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">\n<rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n{}</svg>\n",
            self.body,
            w = self.w,
            h = self.h
        )
    }
}

/// Colours of the legend's series.
pub const PALETTE: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// About `n` round tick values covering `lo..=hi`.
pub fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

/// Box-plot statistics of one group.
#[derive(Clone, Debug, PartialEq)]
pub struct BoxStats {
    pub n: usize,
    pub q1: f64,
    pub median: f64,
    pub q3: f64,
    /// The furthest values within 1.5 IQR of the box.
    pub whisker_lo: f64,
    pub whisker_hi: f64,
    pub outliers: Vec<f64>,
}

/// Quantile `q` (0..=1) of sorted values, interpolated linearly between
/// closest ranks (R's type 7).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let h = (sorted.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let (i, f) = (h.floor() as usize, h - h.floor());
    if i + 1 < sorted.len() {
        sorted[i] + f * (sorted[i + 1] - sorted[i])
    } else {
        sorted[i]
    }
}

/// `None` for no values.
pub fn box_stats(values: &[f64]) -> Option<BoxStats> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let (q1, median, q3) = (quantile(&v, 0.25), quantile(&v, 0.5), quantile(&v, 0.75));
    let iqr = q3 - q1;
    let (lo_fence, hi_fence) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
    let inside: Vec<f64> = v.iter().copied().filter(|x| *x >= lo_fence && *x <= hi_fence).collect();
    Some(BoxStats {
        n: v.len(),
        q1,
        median,
        q3,
        whisker_lo: inside.first().copied().unwrap_or(q1),
        whisker_hi: inside.last().copied().unwrap_or(q3),
        outliers: v.iter().copied().filter(|x| *x < lo_fence || *x > hi_fence).collect(),
    })
}

/// One group (box) of the chart: its label and its runs as (value, series index).
pub struct Group {
    pub label: String,
    pub points: Vec<(f64, usize)>,
}

/// Dots (jittered, coloured by series) over a box plot per group.
pub fn box_chart(title: &str, x_label: &str, y_label: &str, groups: &[Group], series: &[String]) -> String {
    let (w, h) = (900.0, 540.0);
    let (left, right, top, bottom) = (80.0, 190.0, 50.0, 70.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let mut svg = Svg::new(w, h);
    svg.text(w / 2.0, 28.0, 16.0, "middle", 0.0, title);
    let all: Vec<f64> = groups.iter().flat_map(|g| g.points.iter().map(|p| p.0)).collect();
    let (mut lo, mut hi) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    // The y axis does not start at zero (as in the seed study's figures).
    let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.01).max(1e-9);
    lo -= pad;
    hi += pad;
    let y_of = |v: f64| top + ph - (v - lo) / (hi - lo) * ph;
    // Axes, ticks and grid.
    svg.line(left, top, left, top + ph, "black", "axis");
    svg.line(left, top + ph, left + pw, top + ph, "black", "axis");
    for t in ticks(lo, hi, 6) {
        let y = y_of(t);
        svg.line(left - 5.0, y, left, y, "black", "tick");
        svg.line(left, y, left + pw, y, "#dddddd", "grid");
        svg.text(left - 8.0, y + 4.0, 11.0, "end", 0.0, &format!("{t:.1}"));
    }
    svg.text(20.0, top + ph / 2.0, 13.0, "middle", -90.0, y_label);
    svg.text(left + pw / 2.0, h - 20.0, 13.0, "middle", 0.0, x_label);
    let slot = pw / groups.len().max(1) as f64;
    let mut jitter = crate::sweep::Rng::new(0x6a17);
    for (i, g) in groups.iter().enumerate() {
        let cx = left + slot * (i as f64 + 0.5);
        svg.line(cx, top + ph, cx, top + ph + 5.0, "black", "tick");
        svg.text(cx, top + ph + 20.0, 11.0, "middle", 0.0, &format!("{} (n={})", g.label, g.points.len()));
        let values: Vec<f64> = g.points.iter().map(|p| p.0).collect();
        if let Some(b) = box_stats(&values) {
            let bw = (slot * 0.5).min(80.0);
            svg.line(cx, y_of(b.whisker_lo), cx, y_of(b.q1), "black", "whisker");
            svg.line(cx, y_of(b.q3), cx, y_of(b.whisker_hi), "black", "whisker");
            svg.line(cx - bw / 4.0, y_of(b.whisker_lo), cx + bw / 4.0, y_of(b.whisker_lo), "black", "whisker");
            svg.line(cx - bw / 4.0, y_of(b.whisker_hi), cx + bw / 4.0, y_of(b.whisker_hi), "black", "whisker");
            svg.rect(cx - bw / 2.0, y_of(b.q3), bw, y_of(b.q1) - y_of(b.q3), "none", "box");
            svg.line(cx - bw / 2.0, y_of(b.median), cx + bw / 2.0, y_of(b.median), "black", "median");
        }
        for &(v, s) in &g.points {
            let dx = (jitter.range(0, 1000) as f64 / 1000.0 - 0.5) * slot * 0.6;
            svg.circle(cx + dx, y_of(v), 3.0, PALETTE[s % PALETTE.len()], "run");
        }
    }
    // Legend.
    let lx = left + pw + 20.0;
    for (i, s) in series.iter().enumerate() {
        let y = top + 10.0 + i as f64 * 20.0;
        svg.circle(lx, y, 5.0, PALETTE[i % PALETTE.len()], "legend");
        svg.text(lx + 12.0, y + 4.0, 12.0, "start", 0.0, s);
    }
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_statistics() {
        let b = box_stats(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!((b.n, b.q1, b.median, b.q3), (5, 2.0, 3.0, 4.0));
        assert_eq!((b.whisker_lo, b.whisker_hi), (1.0, 5.0));
        assert!(b.outliers.is_empty());
        // Even count: interpolated median and quartiles.
        let b = box_stats(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!((b.q1, b.median, b.q3), (1.75, 2.5, 3.25));
        // An outlier beyond 1.5 IQR: the whisker stops at the last value inside.
        let b = box_stats(&[10.0, 11.0, 12.0, 13.0, 14.0, 100.0]).unwrap();
        assert_eq!(b.outliers, vec![100.0]);
        assert_eq!((b.whisker_lo, b.whisker_hi), (10.0, 14.0));
        let b = box_stats(&[7.0]).unwrap();
        assert_eq!((b.q1, b.median, b.q3, b.whisker_lo, b.whisker_hi), (7.0, 7.0, 7.0, 7.0, 7.0));
        assert!(box_stats(&[]).is_none());
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(93.0, 117.0, 6);
        assert!(t.first().unwrap() >= &93.0 && t.last().unwrap() <= &117.0 && t.len() >= 4, "{t:?}");
    }

    #[test]
    fn chart_has_a_dot_per_run_and_a_box_per_group() {
        let groups = vec![
            Group { label: "1".into(), points: vec![(1.0, 0), (2.0, 1), (3.0, 0)] },
            Group { label: "2 <&>".into(), points: vec![(4.0, 1)] },
        ];
        let s = box_chart("t", "x", "y", &groups, &["a".into(), "b".into()]);
        assert_eq!(s.matches(r#"class="run""#).count(), 4);
        assert_eq!(s.matches(r#"class="box""#).count(), 2);
        assert_eq!(s.matches(r#"class="legend""#).count(), 2);
        assert!(s.contains("2 &lt;&amp;&gt;") && s.ends_with("</svg>\n"));
    }
}
