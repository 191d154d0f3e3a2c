//! Boxes, labels and scores drawn onto an image for people to look at.
//!
//! Text uses the public-domain 8x8 bitmap font from `font8x8`, scaled with the image, so no
//! font file has to ship with the binary.

use font8x8::UnicodeFonts;
use image::{Rgb, RgbImage};
use peregrine_types::{ClassNames, Detection};

/// Ultralytics' palette, so annotated images look familiar to its users.
const PALETTE: [[u8; 3]; 20] = [
    [4, 42, 255],
    [11, 219, 235],
    [243, 243, 243],
    [0, 223, 183],
    [17, 31, 104],
    [255, 111, 221],
    [255, 68, 79],
    [204, 237, 0],
    [0, 243, 68],
    [189, 0, 255],
    [0, 180, 255],
    [221, 0, 186],
    [0, 255, 255],
    [38, 192, 0],
    [1, 255, 179],
    [125, 36, 255],
    [123, 0, 104],
    [255, 27, 108],
    [252, 98, 2],
    [162, 0, 255],
];

fn color(class_id: u32) -> Rgb<u8> {
    Rgb(PALETTE[class_id as usize % PALETTE.len()])
}

/// Black or white, whichever reads better on `bg`.
fn text_color(bg: Rgb<u8>) -> Rgb<u8> {
    let [r, g, b] = bg.0.map(u32::from);
    if r * 299 + g * 587 + b * 114 > 150_000 {
        Rgb([0, 0, 0])
    } else {
        Rgb([255, 255, 255])
    }
}

fn fill_rect(img: &mut RgbImage, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb<u8>) {
    let (w, h) = (i64::from(img.width()), i64::from(img.height()));
    for y in y0.max(0)..y1.min(h) {
        for x in x0.max(0)..x1.min(w) {
            img.put_pixel(x as u32, y as u32, c);
        }
    }
}

fn draw_text(img: &mut RgbImage, x: i64, y: i64, scale: i64, text: &str, c: Rgb<u8>) {
    for (i, ch) in text.chars().enumerate() {
        let Some(glyph) = font8x8::BASIC_FONTS
            .get(ch)
            .or_else(|| font8x8::BASIC_FONTS.get('?'))
        else {
            continue;
        };
        let gx = x + i as i64 * 8 * scale;
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    let px = gx + col * scale;
                    let py = y + row as i64 * scale;
                    fill_rect(img, px, py, px + scale, py + scale, c);
                }
            }
        }
    }
}

/// Draws each detection's box and a `name score` label above it (inside it at the top edge).
pub fn draw_detections(img: &mut RgbImage, detections: &[Detection], names: &ClassNames) {
    draw_labelled(
        img,
        detections
            .iter()
            .map(|d| (*d, format!("{} {:.2}", names.name(d.class_id), d.score))),
    );
}

/// Draws each box in its class's colour with the given label above it (inside it at the top
/// edge): the video snapshots label with track ids as well.
pub fn draw_labelled(img: &mut RgbImage, boxes: impl IntoIterator<Item = (Detection, String)>) {
    let longest_side = img.width().max(img.height()) as i64;
    let thickness = (longest_side / 400).clamp(1, 6);
    let scale = (longest_side / 500).clamp(1, 4);
    for (d, label) in boxes {
        let c = color(d.class_id);
        let (x1, y1) = (d.bbox.x1.round() as i64, d.bbox.y1.round() as i64);
        let (x2, y2) = (d.bbox.x2.round() as i64, d.bbox.y2.round() as i64);
        fill_rect(img, x1, y1, x2, y1 + thickness, c);
        fill_rect(img, x1, y2 - thickness, x2, y2, c);
        fill_rect(img, x1, y1, x1 + thickness, y2, c);
        fill_rect(img, x2 - thickness, y1, x2, y2, c);
        let (lw, lh) = (label.chars().count() as i64 * 8 * scale + 4, 8 * scale + 4);
        let ly = if y1 - lh >= 0 { y1 - lh } else { y1 };
        fill_rect(img, x1, ly, x1 + lw, ly + lh, c);
        draw_text(img, x1 + 2, ly + 2, scale, &label, text_color(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_types::BBox;

    #[test]
    fn draws_box_edges_and_label_inside_bounds() {
        let mut img = RgbImage::from_pixel(100, 80, Rgb([0, 0, 0]));
        let names = ClassNames::new(vec!["person".into()]);
        let det = Detection {
            class_id: 0,
            score: 0.9,
            bbox: BBox::new(20.0, 30.0, 60.0, 70.0),
        };
        draw_detections(&mut img, &[det], &names);
        let c = color(0);
        assert_eq!(*img.get_pixel(40, 69), c, "bottom edge");
        assert_eq!(*img.get_pixel(20, 50), c, "left edge");
        assert_eq!(*img.get_pixel(40, 50), Rgb([0, 0, 0]), "inside stays untouched");
        // The label sits above the box and is drawn in the box colour.
        assert_eq!(*img.get_pixel(21, 19), c);
    }

    #[test]
    fn boxes_outside_the_image_are_clipped_to_it() {
        let black = Rgb([0, 0, 0]);
        let mut img = RgbImage::from_pixel(10, 10, black);
        let det = Detection {
            class_id: 99,
            score: 1.0,
            bbox: BBox::new(-50.0, -50.0, 500.0, 500.0),
        };
        draw_detections(&mut img, &[det], &ClassNames::default());
        // Its edges and its label (above the box, or at its top edge) all lie outside.
        assert!(
            img.pixels().all(|&p| p == black),
            "nothing drawn inside the image"
        );

        // A box partly outside keeps its visible edges.
        let mut img = RgbImage::from_pixel(100, 100, black);
        let det = Detection {
            class_id: 0,
            score: 0.5,
            bbox: BBox::new(50.0, 50.0, 300.0, 300.0),
        };
        draw_detections(&mut img, &[det], &ClassNames::default());
        assert_eq!(*img.get_pixel(50, 80), color(0), "left edge inside the image");
        assert_eq!(*img.get_pixel(80, 50), color(0), "top edge inside the image");
        assert_eq!(*img.get_pixel(99, 80), black, "right edge lies beyond the image");
        assert_eq!(*img.get_pixel(80, 99), black, "bottom edge lies beyond the image");
    }
}
