//! Boxes and detections, in pixel coordinates of whichever image they refer to.

/// An axis-aligned box as corners: `(x1, y1)` top-left, `(x2, y2)` bottom-right, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BBox {
    pub x1: f32,
    pub y1: f32,
    pub x2: f32,
    pub y2: f32,
}

impl BBox {
    pub const fn new(x1: f32, y1: f32, x2: f32, y2: f32) -> Self {
        Self { x1, y1, x2, y2 }
    }

    /// From YOLO's centre/size form.
    pub fn from_cxcywh(cx: f32, cy: f32, w: f32, h: f32) -> Self {
        let (hw, hh) = (w / 2.0, h / 2.0);
        Self::new(cx - hw, cy - hh, cx + hw, cy + hh)
    }

    pub fn width(&self) -> f32 {
        (self.x2 - self.x1).max(0.0)
    }

    pub fn height(&self) -> f32 {
        (self.y2 - self.y1).max(0.0)
    }

    pub fn area(&self) -> f32 {
        self.width() * self.height()
    }

    /// Intersection over union; 0 when either box is empty.
    pub fn iou(&self, other: &BBox) -> f32 {
        let iw = (self.x2.min(other.x2) - self.x1.max(other.x1)).max(0.0);
        let ih = (self.y2.min(other.y2) - self.y1.max(other.y1)).max(0.0);
        let inter = iw * ih;
        let union = self.area() + other.area() - inter;
        if union > 0.0 {
            inter / union
        } else {
            0.0
        }
    }

    /// Clamps every corner into `[0, width] x [0, height]`.
    pub fn clipped(&self, width: f32, height: f32) -> Self {
        Self::new(
            self.x1.clamp(0.0, width),
            self.y1.clamp(0.0, height),
            self.x2.clamp(0.0, width),
            self.y2.clamp(0.0, height),
        )
    }
}

/// One object found in an image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detection {
    pub class_id: u32,
    pub score: f32,
    pub bbox: BBox,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iou_of_identical_boxes_is_one() {
        let b = BBox::new(0.0, 0.0, 10.0, 10.0);
        assert!((b.iou(&b) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn iou_of_half_overlap() {
        let a = BBox::new(0.0, 0.0, 10.0, 10.0);
        let b = BBox::new(5.0, 0.0, 15.0, 10.0);
        // intersection 50, union 150
        assert!((a.iou(&b) - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn iou_of_disjoint_and_empty_boxes_is_zero() {
        let a = BBox::new(0.0, 0.0, 10.0, 10.0);
        assert_eq!(a.iou(&BBox::new(20.0, 20.0, 30.0, 30.0)), 0.0);
        let empty = BBox::new(5.0, 5.0, 5.0, 5.0);
        assert_eq!(empty.iou(&empty), 0.0);
    }

    #[test]
    fn cxcywh_round_trip_and_clip() {
        let b = BBox::from_cxcywh(10.0, 20.0, 4.0, 8.0);
        assert_eq!(b, BBox::new(8.0, 16.0, 12.0, 24.0));
        let c = BBox::new(-5.0, -1.0, 700.0, 30.0).clipped(640.0, 480.0);
        assert_eq!(c, BBox::new(0.0, 0.0, 640.0, 30.0));
    }
}
