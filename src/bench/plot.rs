//! SVG line plots of benchmark series (plotters, SVG backend only): panels side by side, one
//! line with points per series, a legend in each panel.

use std::path::Path;

use plotters::prelude::*;

/// One line: `(x, y)` points in x order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const PANEL_SIZE: (u32, u32) = (640, 440);

/// Colors of successive series (distinguishable, print-safe).
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// Axis range covering `values` with some headroom; never empty.
fn axis(values: impl Iterator<Item = f64>, from_zero: bool) -> std::ops::Range<f64> {
    let (lo, hi) =
        values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let lo = if from_zero { lo.min(0.0) } else { lo };
    let pad = ((hi - lo) * 0.08).max(0.5);
    (if from_zero { lo } else { lo - pad })..(hi + pad)
}

/// Tick count for the x axis: one per distinct x value (at least 2).
fn x_ticks(panel: &Panel) -> usize {
    let mut xs: Vec<f64> = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    xs.len().max(2)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let points = || panel.series.iter().flat_map(|s| s.points.iter().copied());
    let x = axis(points().map(|p| p.0), false);
    let y = axis(points().map(|p| p.1), true);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .x_labels(x_ticks(panel))
        .max_light_lines(2)
        .x_label_formatter(&|v| {
            // Integer x values only (turns, levels): no label between them.
            if (v - v.round()).abs() < 1e-6 {
                format!("{v:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| match v.abs() {
            a if a >= 100.0 || a == 0.0 => format!("{v:.0}"),
            a if a >= 1.0 => format!("{v:.1}"),
            _ => format!("{v:.2}"),
        })
        .draw()
        .map_err(err)?;
    for (idx, series) in panel.series.iter().enumerate() {
        let color = COLORS[idx % COLORS.len()];
        chart
            .draw_series(LineSeries::new(series.points.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(series.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(PointSeries::of_element(
                series.points.iter().copied(),
                4,
                color.filled(),
                &|c, s, st| Circle::new(c, s, st),
            ))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The panels side by side as an SVG document.
pub fn render_svg(panels: &[Panel]) -> Result<String, String> {
    let mut out = String::new();
    {
        let size = (PANEL_SIZE.0 * panels.len().max(1) as u32, PANEL_SIZE.1);
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((1, panels.len().max(1)));
        for (area, panel) in areas.iter().zip(panels) {
            draw_panel(area, panel)?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Writes [`render_svg`] of `panels` to `path`.
pub fn write_svg(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    let svg = render_svg(panels).map_err(|e| anyhow::anyhow!("cannot draw the plot: {e}"))?;
    std::fs::write(path, svg)
        .map_err(|e| anyhow::anyhow!("cannot write the plot to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panels() -> Vec<Panel> {
        let series = |name: &str, ys: &[f64]| Series {
            name: name.into(),
            points: ys.iter().enumerate().map(|(i, y)| (i as f64 + 1.0, *y)).collect(),
        };
        vec![
            Panel {
                title: "TTFT p50".into(),
                x_label: "turn".into(),
                y_label: "ms".into(),
                series: vec![
                    series("one", &[900.0, 1500.0, 2100.0]),
                    series("all", &[900.0, 300.0, 310.0]),
                ],
            },
            Panel {
                title: "computed prefill".into(),
                x_label: "turn".into(),
                y_label: "tokens".into(),
                series: vec![series("one", &[1200.0, 1800.0, 2400.0])],
            },
        ]
    }

    #[test]
    fn svg_is_written_and_looks_like_svg() {
        let dir = std::env::temp_dir().join(format!("kvrun-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plot.svg");
        write_svg(&path, &panels()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("width=\"1280\""), "two panels side by side");
        for text in ["TTFT p50", "computed prefill", "one", "all", "turn", "tokens"] {
            assert!(svg.contains(&format!(">{text}<")) || svg.contains(text), "missing {text}");
        }
        assert!(svg.matches("<polyline").count() >= 3, "a line per series");
        assert!(svg.matches("<circle").count() >= 9, "a point per value");
    }

    #[test]
    fn empty_series_still_draw() {
        let empty = Panel {
            title: "nothing".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![],
        };
        assert!(render_svg(&[empty]).unwrap().contains("nothing"));
    }
}
