//! Which whole pixels a zone covers. A pixel belongs to a zone when a scanline fill of the
//! polygon reaches it or an 8-connected line along one of its edges passes through it: the
//! pixels OpenCV's `fillPoly` sets (vertices on whole pixels, 16.16 fixed-point scanline
//! edges, Bresenham outline), which is the mask supervision's `PolygonZone` looks anchors up
//! in. Deciding on pixels rather than on the exact polygon keeps the two in exact agreement
//! and makes the border itself part of the zone.

use crate::geometry::Xy;

/// Fractional bits of the fixed-point x of a scanline edge.
const SHIFT: u32 = 16;

/// The polygon's vertices rounded to whole pixels.
#[derive(Debug, Clone)]
pub struct Raster {
    vertices: Vec<(i64, i64)>,
    /// Smallest and largest vertex coordinates: nothing outside is covered.
    bounds: ((i64, i64), (i64, i64)),
}

/// `ceil(n / d)` for `d > 0`.
fn ceil_div(n: i64, d: i64) -> i64 {
    n.div_euclid(d) + i64::from(n.rem_euclid(d) != 0)
}

/// Whether the 8-connected line from `a` to `b` passes through `p`. The line is walked from
/// its left end one pixel at a time along its major axis; the minor coordinate is the
/// nearest one, a tie going back towards the start.
fn on_line(a: (i64, i64), b: (i64, i64), p: (i64, i64)) -> bool {
    let (start, end) = if b.0 < a.0 { (b, a) } else { (a, b) };
    let dx = end.0 - start.0;
    let dy = end.1 - start.1;
    let down = if dy < 0 { -1 } else { 1 };
    let (major, minor) = if dy.abs() > dx {
        ((p.1 - start.1) * down, p.0 - start.0)
    } else {
        (p.0 - start.0, (p.1 - start.1) * down)
    };
    let (long, short) = if dy.abs() > dx {
        (dy.abs(), dx)
    } else {
        (dx, dy.abs())
    };
    if major < 0 || major > long {
        return false;
    }
    if long == 0 {
        return p == start;
    }
    minor == ceil_div(2 * major * short - long, 2 * long)
}

impl Raster {
    pub(crate) fn new(points: &[Xy]) -> Self {
        let vertices: Vec<(i64, i64)> = points
            .iter()
            .map(|(x, y)| (x.round() as i64, y.round() as i64))
            .collect();
        let low = vertices
            .iter()
            .fold((i64::MAX, i64::MAX), |m, v| (m.0.min(v.0), m.1.min(v.1)));
        let high = vertices
            .iter()
            .fold((i64::MIN, i64::MIN), |m, v| (m.0.max(v.0), m.1.max(v.1)));
        Self {
            vertices,
            bounds: (low, high),
        }
    }

    fn edges(&self) -> impl Iterator<Item = ((i64, i64), (i64, i64))> + '_ {
        let n = self.vertices.len();
        (0..n).map(move |i| (self.vertices[i], self.vertices[(i + 1) % n]))
    }

    /// Whether the scanline fill reaches `(x, y)`: edges cover rows `[top, bottom)`, their x
    /// on row `y` is fixed point with the slope truncated, and the row is filled between
    /// pairs of edge crossings, each rounded towards the inside.
    fn filled(&self, x: i64, y: i64) -> bool {
        // Row `y` is filled from ceil(c0) to floor(c1), ceil(c2) to floor(c3), ... over the
        // sorted crossings; in fixed point, `x` is in a span exactly when it equals a crossing
        // or an odd number of crossings lie before it, so no sort is needed.
        let fixed_x = x << SHIFT;
        let mut before = 0usize;
        for (a, b) in self.edges().filter(|(a, b)| a.1 != b.1) {
            let (top, bottom) = if a.1 < b.1 { (a, b) } else { (b, a) };
            if !(top.1..bottom.1).contains(&y) {
                continue;
            }
            let slope = ((bottom.0 - top.0) << SHIFT) / (bottom.1 - top.1);
            let crossing = (top.0 << SHIFT) + (y - top.1) * slope;
            if crossing == fixed_x {
                return true;
            }
            before += usize::from(crossing < fixed_x);
        }
        before % 2 == 1
    }

    /// Whether pixel `(x, y)` is in the zone.
    pub fn contains(&self, x: i64, y: i64) -> bool {
        let (low, high) = self.bounds;
        if x < low.0 || y < low.1 || x > high.0 || y > high.1 {
            return false;
        }
        self.edges().any(|(a, b)| on_line(a, b, (x, y))) || self.filled(x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raster(points: &[(f64, f64)]) -> Raster {
        Raster::new(points)
    }

    #[test]
    fn a_rectangle_covers_its_border_and_nothing_beyond() {
        let r = raster(&[(2.0, 2.0), (6.0, 2.0), (6.0, 6.0), (2.0, 6.0)]);
        let count = (0..10)
            .flat_map(|y| (0..10).map(move |x| (x, y)))
            .filter(|(x, y)| r.contains(*x, *y))
            .count();
        assert_eq!(count, 25, "5x5 pixels, as supervision's polygon_to_mask example");
        assert!(r.contains(6, 6) && r.contains(2, 4));
        assert!(!r.contains(7, 4) && !r.contains(4, 1));
    }

    #[test]
    fn lines_round_to_the_nearest_pixel_ties_towards_the_start() {
        // Slope 1/2 from (0, 0): x = 1 is a tie (y 0.5) and stays at 0; x = 3 (1.5) at 1.
        let line = [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)];
        for p in line {
            assert!(on_line((0, 0), (4, 2), p), "{p:?}");
            assert!(
                on_line((4, 2), (0, 0), p),
                "{p:?} walked from the left end either way"
            );
        }
        assert!(!on_line((0, 0), (4, 2), (1, 1)));
        assert!(!on_line((0, 0), (4, 2), (5, 2)));
        // Steep: walked along y.
        assert!(on_line((0, 0), (2, 4), (0, 1)) && on_line((0, 0), (2, 4), (1, 3)));
        assert!(on_line((0, 4), (2, 0), (1, 2)) && !on_line((0, 4), (2, 0), (0, 2)));
    }

    #[test]
    fn a_slanted_edge_covers_pixels_just_outside_the_exact_polygon() {
        let r = raster(&[(0.0, 0.0), (10.0, 0.0), (0.0, 5.0)]);
        // The hypotenuse passes y = 2.5 at x = 5: pixel (5, 2) is on its line (the tie goes
        // back to the left end's side) though the exact polygon ends at y 2.5 there.
        assert!(r.contains(5, 2));
        assert!(!r.contains(6, 3));
    }

    #[test]
    fn a_quadrilateral_covers_the_pixels_opencv_fills() {
        // supervision 0.31.2 `polygon_to_mask` (OpenCV 5.0 `fillPoly`) of this polygon.
        let expected = [
            "..............",
            ".###..........",
            ".#########....",
            ".############.",
            ".############.",
            "..##########..",
            "..##########..",
            "..#########...",
            "..#########...",
            "....#######...",
            "......####....",
            "........##....",
            "..............",
        ];
        let r = raster(&[(1.0, 1.0), (12.0, 3.0), (9.0, 11.0), (2.0, 8.0)]);
        for (y, row) in expected.iter().enumerate() {
            let drawn: String = (0..14)
                .map(|x| if r.contains(x, y as i64) { '#' } else { '.' })
                .collect();
            assert_eq!(drawn, *row, "row {y}");
        }
    }
}
