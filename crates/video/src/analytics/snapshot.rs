//! Pictures of frames for people: boxes and labels drawn on a copy of the frame, encoded
//! as JPEG. Made only when an event or a viewer asks, never per frame by default.

use image::RgbImage;
use peregrine_types::{BBox, ClassNames, Detection};

use crate::frame::Frame;

/// JPEG quality of snapshots and live views: small files, boxes and faces still legible.
pub const QUALITY: u8 = 85;
/// Margin around a cropped object, as a fraction of its box's size on each side.
const CROP_MARGIN: f32 = 0.25;

/// What to draw: each detection with its track id, if it has one.
pub(crate) struct Overlay<'a> {
    pub detections: &'a [Detection],
    pub track_ids: &'a [Option<u64>],
    pub names: &'a ClassNames,
}

impl Overlay<'_> {
    fn labelled(&self) -> impl Iterator<Item = (Detection, String)> + '_ {
        self.detections.iter().enumerate().map(|(i, d)| {
            let name = self.names.name(d.class_id);
            let label = match self.track_ids.get(i).copied().flatten() {
                Some(id) => format!("{name} #{id} {:.2}", d.score),
                None => format!("{name} {:.2}", d.score),
            };
            (*d, label)
        })
    }
}

/// The frame as a JPEG, with `overlay` drawn when given, cropped around `crop` when given.
pub(crate) fn encode(frame: &Frame, overlay: Option<&Overlay<'_>>, crop: Option<BBox>) -> Option<Vec<u8>> {
    let (w, h) = (frame.width(), frame.height());
    let region = crop.map(|b| crop_region(b, w, h)).unwrap_or((0, 0, w, h));
    let (x0, y0, cw, ch) = region;
    let data = match frame.pixels() {
        Ok(data) => data,
        Err(e) => {
            tracing::warn!(stream = %frame.meta.stream, error = %e, "snapshot not made: the frame could not be copied from the GPU");
            return None;
        }
    };
    let mut img = RgbImage::new(cw, ch);
    let row = cw as usize * 3;
    for (y, out) in img.chunks_exact_mut(row).enumerate() {
        let start = (y0 as usize + y) * frame.stride() + x0 as usize * 3;
        out.copy_from_slice(&data[start..start + row]);
    }
    if let Some(overlay) = overlay {
        let (dx, dy) = (x0 as f32, y0 as f32);
        let shifted = overlay.labelled().map(|(mut d, label)| {
            d.bbox = BBox::new(d.bbox.x1 - dx, d.bbox.y1 - dy, d.bbox.x2 - dx, d.bbox.y2 - dy);
            (d, label)
        });
        peregrine_vision::annotate::draw_labelled(&mut img, shifted);
    }
    match peregrine_vision::encode::jpeg(img.as_raw(), cw, ch, row, QUALITY) {
        Ok(jpeg) => Some(jpeg),
        Err(e) => {
            tracing::warn!(stream = %frame.meta.stream, error = %e, "snapshot not encoded");
            None
        }
    }
}

/// `(x, y, width, height)` of `b` grown by the margin and clipped to the frame; at least
/// one pixel each way.
fn crop_region(b: BBox, width: u32, height: u32) -> (u32, u32, u32, u32) {
    let (mx, my) = (b.width() * CROP_MARGIN, b.height() * CROP_MARGIN);
    let clip = |v: f32, max: u32| v.clamp(0.0, max as f32) as u32;
    let (x1, y1) = (clip(b.x1 - mx, width - 1), clip(b.y1 - my, height - 1));
    let (x2, y2) = (clip(b.x2 + mx, width), clip(b.y2 + my, height));
    (x1, y1, x2.saturating_sub(x1).max(1), y2.saturating_sub(y1).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{test_meta, FramePool};

    fn gray_frame(w: u32, h: u32) -> Frame {
        let mut frame = FramePool::new(1).take(w, h, test_meta(0)).unwrap();
        frame.data_mut().fill(128);
        frame
    }

    #[test]
    fn a_snapshot_decodes_to_the_frame_with_its_boxes_drawn() {
        let frame = gray_frame(64, 48);
        let det = Detection {
            class_id: 0,
            score: 0.9,
            bbox: BBox::new(10.0, 20.0, 50.0, 40.0),
        };
        let names = ClassNames::new(vec!["person".into()]);
        let overlay = Overlay {
            detections: &[det],
            track_ids: &[Some(3)],
            names: &names,
        };
        let plain = encode(&frame, None, None).unwrap();
        let drawn = encode(&frame, Some(&overlay), None).unwrap();
        let decode = |b: &[u8]| {
            peregrine_vision::decode::decode_image(b, Default::default())
                .unwrap()
                .rgb
        };
        let (plain, drawn) = (decode(&plain), decode(&drawn));
        assert_eq!(plain.dimensions(), (64, 48));
        let grayish = |p: &image::Rgb<u8>| p.0.iter().all(|&c| (120..=136).contains(&c));
        assert!(plain.pixels().all(grayish), "nothing drawn without an overlay");
        assert!(
            !grayish(drawn.get_pixel(30, 39)),
            "the box's bottom edge is drawn"
        );
    }

    #[test]
    fn a_crop_is_the_box_with_a_margin_inside_the_frame() {
        assert_eq!(
            crop_region(BBox::new(10.0, 10.0, 30.0, 50.0), 100, 100),
            (5, 0, 30, 60)
        );
        assert_eq!(
            crop_region(BBox::new(90.0, 90.0, 120.0, 130.0), 100, 100),
            (82, 80, 18, 20)
        );
        let frame = gray_frame(100, 100);
        let jpeg = encode(&frame, None, Some(BBox::new(10.0, 10.0, 30.0, 50.0))).unwrap();
        let img = peregrine_vision::decode::decode_image(&jpeg, Default::default()).unwrap();
        assert_eq!(img.size, (30, 60));
    }
}
