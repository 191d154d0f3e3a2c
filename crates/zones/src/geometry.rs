//! Plane geometry on pixel coordinates: the anchor point of a box, distances and segment
//! intersection. Everything is computed in `f64` from the `f32` inputs so that sign
//! tests come out the same as supervision's (NumPy `float64`) on the same numbers.

use std::fmt;
use std::str::FromStr;

use peregrine_types::BBox;

use crate::raster::Raster;

/// A point in the image plane; pixels or fractions of the frame, as its spec's `Units` say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub x: f32,
    pub y: f32,
}

impl Point {
    pub const fn new(x: f32, y: f32) -> Self {
        Self { x, y }
    }
}

/// Which point of a box decides where the object is. Image `y` grows downwards, so "bottom"
/// is the larger `y`: the feet of a standing person, as Frigate and supervision use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Anchor {
    #[default]
    BottomCenter,
    Center,
    TopCenter,
    BottomLeft,
    BottomRight,
    TopLeft,
    TopRight,
    CenterLeft,
    CenterRight,
}

const ANCHOR_NAMES: [(Anchor, &str); 9] = [
    (Anchor::BottomCenter, "bottom_center"),
    (Anchor::Center, "center"),
    (Anchor::TopCenter, "top_center"),
    (Anchor::BottomLeft, "bottom_left"),
    (Anchor::BottomRight, "bottom_right"),
    (Anchor::TopLeft, "top_left"),
    (Anchor::TopRight, "top_right"),
    (Anchor::CenterLeft, "center_left"),
    (Anchor::CenterRight, "center_right"),
];

impl Anchor {
    /// The anchor's coordinates on `bbox`; midpoints as `(a + b) / 2`, as supervision does.
    pub fn of(self, bbox: &BBox) -> (f64, f64) {
        let (x1, y1, x2, y2) = (
            f64::from(bbox.x1),
            f64::from(bbox.y1),
            f64::from(bbox.x2),
            f64::from(bbox.y2),
        );
        let (cx, cy) = ((x1 + x2) / 2.0, (y1 + y2) / 2.0);
        match self {
            Anchor::BottomCenter => (cx, y2),
            Anchor::Center => (cx, cy),
            Anchor::TopCenter => (cx, y1),
            Anchor::BottomLeft => (x1, y2),
            Anchor::BottomRight => (x2, y2),
            Anchor::TopLeft => (x1, y1),
            Anchor::TopRight => (x2, y1),
            Anchor::CenterLeft => (x1, cy),
            Anchor::CenterRight => (x2, cy),
        }
    }

    pub fn name(self) -> &'static str {
        ANCHOR_NAMES
            .iter()
            .find(|(anchor, _)| *anchor == self)
            .map_or("bottom_center", |(_, name)| name)
    }
}

impl fmt::Display for Anchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An anchor name that is none of the nine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown anchor `{0}`: expected one of bottom_center, center, top_center, bottom_left, bottom_right, top_left, top_right, center_left, center_right")]
pub struct UnknownAnchor(pub String);

impl FromStr for Anchor {
    type Err = UnknownAnchor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ANCHOR_NAMES
            .iter()
            .find(|(_, name)| *name == s)
            .map(|(anchor, _)| *anchor)
            .ok_or_else(|| UnknownAnchor(s.to_owned()))
    }
}

/// A point in pixels, in `f64`.
pub(crate) type Xy = (f64, f64);

/// `(b - a) x (p - a)`: positive when `p` is to the right of `a -> b` as seen on screen
/// (image `y` points down), negative to its left, zero on the line. Written exactly as
/// supervision's `cross_product` so the signs agree bit for bit.
pub(crate) fn cross(a: Xy, b: Xy, p: Xy) -> f64 {
    let (vx, vy) = (b.0 - a.0, b.1 - a.1);
    let (dx, dy) = (p.0 - a.0, p.1 - a.1);
    vx * dy - vy * dx
}

/// Twice the signed area (shoelace); zero for a degenerate polygon.
pub(crate) fn doubled_area(points: &[Xy]) -> f64 {
    let n = points.len();
    (0..n)
        .map(|i| {
            let (a, b) = (points[i], points[(i + 1) % n]);
            a.0 * b.1 - b.0 * a.1
        })
        .sum()
}

/// Distance from `p` to the segment `a-b`.
pub(crate) fn segment_distance(a: Xy, b: Xy, p: Xy) -> f64 {
    let (vx, vy) = (b.0 - a.0, b.1 - a.1);
    let len2 = vx * vx + vy * vy;
    let t = if len2 > 0.0 {
        (((p.0 - a.0) * vx + (p.1 - a.1) * vy) / len2).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (qx, qy) = (a.0 + t * vx, a.1 + t * vy);
    ((p.0 - qx).powi(2) + (p.1 - qy).powi(2)).sqrt()
}

fn on_segment(a: Xy, b: Xy, p: Xy) -> bool {
    cross(a, b, p) == 0.0
        && p.0 >= a.0.min(b.0)
        && p.0 <= a.0.max(b.0)
        && p.1 >= a.1.min(b.1)
        && p.1 <= a.1.max(b.1)
}

/// Whether segments `a-b` and `c-d` share at least one point (touching counts).
pub(crate) fn segments_meet(a: Xy, b: Xy, c: Xy, d: Xy) -> bool {
    let (d1, d2) = (cross(a, b, c), cross(a, b, d));
    let (d3, d4) = (cross(c, d, a), cross(c, d, b));
    if ((d1 > 0.0 && d2 < 0.0) || (d1 < 0.0 && d2 > 0.0))
        && ((d3 > 0.0 && d4 < 0.0) || (d3 < 0.0 && d4 > 0.0))
    {
        return true;
    }
    on_segment(a, b, c) || on_segment(a, b, d) || on_segment(c, d, a) || on_segment(c, d, b)
}

/// A closed polygon in pixels, already validated as simple and of non-zero area.
#[derive(Debug, Clone)]
pub(crate) struct Polygon {
    points: Vec<Xy>,
    raster: Raster,
}

impl Polygon {
    pub(crate) fn new(points: Vec<Xy>) -> Self {
        let raster = Raster::new(&points);
        Self { points, raster }
    }

    /// Whether the pixel `(x, y)` belongs to the zone as drawn on the pixel grid.
    pub(crate) fn contains_pixel(&self, x: i64, y: i64) -> bool {
        self.raster.contains(x, y)
    }

    fn edges(&self) -> impl Iterator<Item = (Xy, Xy)> + '_ {
        let n = self.points.len();
        (0..n).map(move |i| (self.points[i], self.points[(i + 1) % n]))
    }

    /// Distance from `p` to the nearest edge.
    pub(crate) fn boundary_distance(&self, p: Xy) -> f64 {
        self.edges()
            .map(|(a, b)| segment_distance(a, b, p))
            .fold(f64::INFINITY, f64::min)
    }
}

/// The first pair of edges (by index) of the closed polygon `points` that meet where they
/// should not: non-adjacent edges that touch, or adjacent edges that fold back over each other.
pub(crate) fn first_self_intersection(points: &[Xy]) -> Option<(usize, usize)> {
    let n = points.len();
    let edge = |i: usize| (points[i], points[(i + 1) % n]);
    for i in 0..n {
        for j in i + 1..n {
            let ((a, b), (c, d)) = (edge(i), edge(j));
            let adjacent = j == i + 1 || (i == 0 && j == n - 1);
            if adjacent {
                // Adjacent edges share a vertex; they only overlap if they are collinear and
                // the far end of one lies on the other (a spike that folds back).
                let (shared, far_i, far_j) = if j == i + 1 { (b, a, d) } else { (a, b, c) };
                if cross(far_i, shared, far_j) == 0.0
                    && (on_segment(far_i, shared, far_j) || on_segment(shared, far_j, far_i))
                {
                    return Some((i, j));
                }
            } else if segments_meet(a, b, c, d) {
                return Some((i, j));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_round_trip_through_their_names() {
        for (anchor, name) in ANCHOR_NAMES {
            assert_eq!(anchor.to_string(), name);
            assert_eq!(name.parse::<Anchor>(), Ok(anchor));
        }
        assert_eq!(Anchor::default(), Anchor::BottomCenter);
        let err = "feet".parse::<Anchor>().unwrap_err();
        assert!(err.to_string().contains("unknown anchor `feet`"), "{err}");
    }

    #[test]
    fn anchor_coordinates() {
        let b = BBox::new(10.0, 20.0, 30.0, 60.0);
        assert_eq!(Anchor::BottomCenter.of(&b), (20.0, 60.0));
        assert_eq!(Anchor::Center.of(&b), (20.0, 40.0));
        assert_eq!(Anchor::TopCenter.of(&b), (20.0, 20.0));
        assert_eq!(Anchor::BottomLeft.of(&b), (10.0, 60.0));
        assert_eq!(Anchor::BottomRight.of(&b), (30.0, 60.0));
        assert_eq!(Anchor::TopLeft.of(&b), (10.0, 20.0));
        assert_eq!(Anchor::TopRight.of(&b), (30.0, 20.0));
        assert_eq!(Anchor::CenterLeft.of(&b), (10.0, 40.0));
        assert_eq!(Anchor::CenterRight.of(&b), (30.0, 40.0));
    }

    #[test]
    fn distance_to_the_boundary() {
        let triangle = Polygon::new(vec![(0.0, 0.0), (10.0, 0.0), (0.0, 10.0)]);
        assert_eq!(triangle.boundary_distance((2.0, 1.0)), 1.0);
        assert_eq!(triangle.boundary_distance((-3.0, 5.0)), 3.0);
        assert!(triangle.contains_pixel(0, 0) && !triangle.contains_pixel(6, 5));
    }

    #[test]
    fn self_intersections() {
        let bowtie = [(0.0, 0.0), (10.0, 10.0), (10.0, 0.0), (0.0, 10.0)];
        assert_eq!(first_self_intersection(&bowtie), Some((0, 2)));
        let square = [(0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0)];
        assert_eq!(first_self_intersection(&square), None);
        let spike = [(0.0, 0.0), (10.0, 0.0), (5.0, 0.0), (5.0, 10.0)];
        assert_eq!(first_self_intersection(&spike), Some((0, 1)));
        let touching = [(0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (5.0, 0.0), (0.0, 10.0)];
        assert!(first_self_intersection(&touching).is_some());
    }
}
