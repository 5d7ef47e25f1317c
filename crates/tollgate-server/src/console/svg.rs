//! The console's charts, drawn on the server as SVG.
//!
//! Two shapes serve every page: a horizontal bar of segments (a balance
//! and its parts) and columns of stacked segments (totals per time bucket
//! and series). Colours come from the stylesheet's classes (`seg-*`, `s0`
//! to `s7`), so the markup carries no inline style and passes the
//! console's Content-Security-Policy. Every segment has a `<title>` with its
//! exact value; the pages print the same numbers as text beside each chart.

use maud::{Markup, html};

/// One part of a bar: a class for its colour, a label and its value.
pub(crate) struct Segment<'a> {
    pub(crate) class: &'a str,
    pub(crate) label: &'a str,
    pub(crate) value: u128,
}

const BAR_WIDTH: f64 = 1000.0;
const BAR_HEIGHT: f64 = 28.0;

/// A bar `total` wide whose segments are laid left to right; a total of 0
/// draws an empty bar.
pub(crate) fn bar(title: &str, total: u128, segments: &[Segment<'_>]) -> Markup {
    let scale = if total == 0 { 0.0 } else { BAR_WIDTH / total as f64 };
    let mut x = 0.0;
    let placed: Vec<(f64, f64, &Segment<'_>)> = segments
        .iter()
        .map(|segment| {
            let width = segment.value as f64 * scale;
            let at = x;
            x += width;
            (at, width, segment)
        })
        .collect();
    html! {
        svg.bar role="img" aria-label=(title) viewBox={"0 0 " (BAR_WIDTH) " " (BAR_HEIGHT)}
            preserveAspectRatio="none" width="100%" height=(BAR_HEIGHT) {
            title { (title) }
            rect.bar-track x="0" y="0" width=(BAR_WIDTH) height=(BAR_HEIGHT) {}
            @for (x, width, segment) in &placed {
                rect class=(segment.class) x=(round(*x)) y="0" width=(round(*width)) height=(BAR_HEIGHT) {
                    title { (segment.label) ": " (segment.value) }
                }
            }
        }
    }
}

/// Columns of stacked values: `columns[i][s]` is series `s` in column `i`.
pub(crate) struct Stacked<'a> {
    pub(crate) title: &'a str,
    /// One label per column, drawn under every `label_every`-th column.
    pub(crate) column_labels: &'a [String],
    pub(crate) label_every: usize,
    pub(crate) series: &'a [String],
    pub(crate) columns: &'a [Vec<u128>],
}

const CHART_WIDTH: f64 = 720.0;
const CHART_HEIGHT: f64 = 240.0;
const PLOT_LEFT: f64 = 64.0;
const PLOT_TOP: f64 = 12.0;
const PLOT_BOTTOM: f64 = 208.0;
/// Series colours cycle through this many classes.
pub(crate) const PALETTE: usize = 8;

/// The class of series `index`'s colour.
pub(crate) fn series_class(index: usize) -> String {
    format!("s{}", index % PALETTE)
}

/// One drawn segment of a column.
struct Placed<'a> {
    class: String,
    x: f64,
    y: f64,
    height: f64,
    column: &'a str,
    series: &'a str,
    value: u128,
}

/// A stacked column chart with its largest column's total on the y axis.
pub(crate) fn stacked(chart: &Stacked<'_>) -> Markup {
    let peak = chart.columns.iter().map(|column| column.iter().sum::<u128>()).max().unwrap_or(0);
    let slot = (CHART_WIDTH - PLOT_LEFT) / chart.columns.len().max(1) as f64;
    let placed = place(chart, peak, slot);
    let ticks =
        chart.column_labels.iter().enumerate().filter(|(i, _)| chart.label_every > 0 && i % chart.label_every == 0);
    html! {
        svg.chart role="img" aria-label=(chart.title) viewBox={"0 0 " (CHART_WIDTH) " " (CHART_HEIGHT)} width="100%" {
            title { (chart.title) }
            line.axis x1=(PLOT_LEFT) y1=(PLOT_BOTTOM) x2=(CHART_WIDTH) y2=(PLOT_BOTTOM) {}
            line.axis x1=(PLOT_LEFT) y1=(PLOT_TOP) x2=(PLOT_LEFT) y2=(PLOT_BOTTOM) {}
            text.tick x=(PLOT_LEFT - 6.0) y=(PLOT_TOP + 4.0) text-anchor="end" { (peak) }
            text.tick x=(PLOT_LEFT - 6.0) y=(PLOT_BOTTOM) text-anchor="end" { "0" }
            @for rect in &placed {
                rect class=(rect.class) x=(round(rect.x)) y=(round(rect.y)) width=(round(slot * 0.8))
                    height=(round(rect.height)) {
                    title { (rect.column) " · " (rect.series) ": " (rect.value) }
                }
            }
            @for (i, label) in ticks {
                text.tick x=(round(PLOT_LEFT + slot * (i as f64 + 0.5))) y=(PLOT_BOTTOM + 18.0) text-anchor="middle" {
                    (label)
                }
            }
        }
    }
}

/// Each nonzero value's segment, stacked upwards from the axis.
fn place<'a>(chart: &Stacked<'a>, peak: u128, slot: f64) -> Vec<Placed<'a>> {
    let scale = if peak == 0 { 0.0 } else { (PLOT_BOTTOM - PLOT_TOP) / peak as f64 };
    let mut placed = Vec::new();
    for (i, column) in chart.columns.iter().enumerate() {
        let x = PLOT_LEFT + slot * i as f64 + slot * 0.1;
        let mut top = PLOT_BOTTOM;
        for (s, &value) in column.iter().enumerate().filter(|(_, value)| **value > 0) {
            let height = value as f64 * scale;
            top -= height;
            placed.push(Placed {
                class: series_class(s),
                x,
                y: top,
                height,
                column: chart.column_labels.get(i).map_or("", String::as_str),
                series: chart.series.get(s).map_or("", String::as_str),
                value,
            });
        }
    }
    placed
}

/// Coordinates to a tenth, which is finer than any screen shows.
fn round(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_lays_its_segments_side_by_side_in_proportion() {
        let segments = [
            Segment { class: "seg-available", label: "available", value: 1 },
            Segment { class: "seg-reserved", label: "reserved", value: 3 },
        ];
        let svg = bar("balance", 4, &segments).into_string();
        assert!(svg.contains(r#"class="seg-available" x="0" y="0" width="250""#), "{svg}");
        assert!(svg.contains(r#"class="seg-reserved" x="250" y="0" width="750""#), "{svg}");
        assert!(svg.contains("<title>reserved: 3</title>"), "{svg}");
        let empty = bar("balance", 0, &segments).into_string();
        assert!(empty.contains(r#"width="0""#), "{empty}");
    }

    #[test]
    fn stacked_columns_scale_to_the_tallest_and_escape_their_labels() {
        let labels = ["00:00".to_owned(), "01:00".to_owned()];
        let series = ["<b>key</b>".to_owned(), "other".to_owned()];
        let columns = [vec![2, 2], vec![1, 0]];
        let chart =
            Stacked { title: "usage", column_labels: &labels, label_every: 1, series: &series, columns: &columns };
        let svg = stacked(&chart).into_string();
        assert!(svg.contains(">4</text>"), "the peak is the tallest column's total: {svg}");
        assert!(svg.contains("&lt;b&gt;key&lt;/b&gt;"), "{svg}");
        assert!(!svg.contains("<b>"), "{svg}");
        assert_eq!(svg.matches("<rect").count(), 3, "empty segments are not drawn: {svg}");
    }
}
