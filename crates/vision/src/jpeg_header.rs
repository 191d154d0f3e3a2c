//! The few facts of a JPEG's header that decide whether a GPU decoder reproduces the CPU's
//! pixels: the frame type, the components' sampling factors and the colour space
//! libjpeg-turbo would assume. Read by walking the marker segments up to the first scan,
//! without decoding anything.

use crate::jpeg_planes::ChromaSubsampling;

/// The start-of-frame segment and the colour-space markers before the first scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// SOF0 (0xC0) is baseline Huffman; others are progressive, lossless, arithmetic...
    pub marker: u8,
    pub precision: u8,
    pub width: u16,
    pub height: u16,
    /// (component id, horizontal factor, vertical factor) per component.
    pub components: Vec<(u8, u8, u8)>,
    pub saw_jfif: bool,
    /// The transform flag of an Adobe APP14 segment, if there is one.
    pub adobe_transform: Option<u8>,
}

impl FrameHeader {
    /// Whether libjpeg-turbo decodes a three-component frame as YCbCr (converting it to
    /// RGB) rather than as RGB already: `default_decompress_parms` in jdapimin.c.
    pub fn is_ycbcr(&self) -> bool {
        if self.components.len() != 3 {
            return false;
        }
        if self.saw_jfif {
            return true;
        }
        if let Some(transform) = self.adobe_transform {
            return transform != 0;
        }
        let ids: Vec<u8> = self.components.iter().map(|c| c.0).collect();
        ids != [b'R', b'G', b'B']
    }

    /// The chroma layout, when it is one [`ChromaSubsampling`] reproduces exactly.
    pub fn subsampling(&self) -> Option<ChromaSubsampling> {
        match self.components.as_slice() {
            [_] => Some(ChromaSubsampling::Gray),
            [(_, yh, yv), (_, bh, bv), (_, rh, rv)] if self.is_ycbcr() => {
                ChromaSubsampling::from_factors((*yh, *yv), [(*bh, *bv), (*rh, *rv)])
            }
            _ => None,
        }
    }

    /// Parses `bytes` from SOI to the first scan. `None` when there is no frame header
    /// before the scan or the segments run past the end before one; a file cut off after
    /// its frame header still gives it (the decoder then says it is truncated).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let mut frame: Option<Self> = None;
        let (mut saw_jfif, mut adobe_transform) = (false, None);
        let mut i = 2;
        // Each step reads one segment; `None` is the end of the header (or of the bytes).
        let mut step = |i: &mut usize| -> Option<()> {
            // Markers may be preceded by fill bytes (0xFF).
            while *bytes.get(*i)? == 0xFF && *bytes.get(*i + 1)? == 0xFF {
                *i += 1;
            }
            if *bytes.get(*i)? != 0xFF {
                return None;
            }
            let marker = *bytes.get(*i + 1)?;
            if marker == 0xDA || marker == 0xD9 {
                return None;
            }
            let len = u16::from_be_bytes([*bytes.get(*i + 2)?, *bytes.get(*i + 3)?]) as usize;
            let seg = bytes.get(*i + 4..(*i + 2 + len).max(*i + 4))?;
            match marker {
                // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC); the first one counts.
                0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) && frame.is_none() => {
                    frame = Some(Self::frame(marker, seg)?);
                }
                // jdmarker.c's get_interesting_appn: APP0 "JFIF\0" (14 bytes at least) and
                // APP14 "Adobe" (12 bytes at least, the transform last).
                0xE0 if seg.len() >= 14 && seg.starts_with(b"JFIF\0") => saw_jfif = true,
                0xEE if seg.len() >= 12 && seg.starts_with(b"Adobe") => adobe_transform = Some(seg[11]),
                _ => {}
            }
            *i += 2 + len;
            Some(())
        };
        while step(&mut i).is_some() {}
        let mut frame = frame?;
        frame.saw_jfif = saw_jfif;
        frame.adobe_transform = adobe_transform;
        Some(frame)
    }

    fn frame(marker: u8, seg: &[u8]) -> Option<Self> {
        if seg.len() < 6 {
            return None;
        }
        let count = usize::from(seg[5]);
        let components = seg
            .get(6..6 + 3 * count)?
            .chunks_exact(3)
            .map(|c| (c[0], c[1] >> 4, c[1] & 0x0F))
            .collect();
        Some(Self {
            marker,
            precision: seg[0],
            height: u16::from_be_bytes([seg[1], seg[2]]),
            width: u16::from_be_bytes([seg[3], seg[4]]),
            components,
            saw_jfif: false,
            adobe_transform: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbojpeg::{Colorspace, Subsamp};

    fn jpeg(subsamp: Subsamp, colorspace: Colorspace) -> Vec<u8> {
        let pixels: Vec<u8> = (0..24 * 16 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let image = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width: 24,
            pitch: 24 * 3,
            height: 16,
            format: turbojpeg::PixelFormat::RGB,
        };
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_subsamp(subsamp).unwrap();
        c.set_colorspace(colorspace).unwrap();
        c.compress_to_vec(image).unwrap()
    }

    /// Removes the APP0 (JFIF) segment right after SOI, if there is one.
    fn without_jfif(jpeg: &[u8]) -> Vec<u8> {
        if jpeg[2..4] != [0xFF, 0xE0] {
            return jpeg.to_vec();
        }
        let len = u16::from_be_bytes([jpeg[4], jpeg[5]]) as usize;
        [&jpeg[..2], &jpeg[4 + len..]].concat()
    }

    fn with_adobe(jpeg: &[u8], transform: u8) -> Vec<u8> {
        let mut seg = b"Adobe\x00\x64\x00\x00\x00\x00".to_vec();
        seg.push(transform);
        let mut out = jpeg[..2].to_vec();
        out.extend_from_slice(&[0xFF, 0xEE]);
        out.extend_from_slice(&((seg.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(&seg);
        out.extend_from_slice(&jpeg[2..]);
        out
    }

    #[test]
    fn the_layout_is_libjpeg_turbos() {
        for (subsamp, expected) in [
            (Subsamp::None, Some(ChromaSubsampling::None)),
            (Subsamp::Sub2x1, Some(ChromaSubsampling::Half)),
            (Subsamp::Sub2x2, Some(ChromaSubsampling::Quarter)),
            (Subsamp::Sub1x2, Some(ChromaSubsampling::HalfRows)),
            (Subsamp::Gray, Some(ChromaSubsampling::Gray)),
            (Subsamp::Sub4x1, None),
        ] {
            let colorspace = if subsamp == Subsamp::Gray {
                Colorspace::Gray
            } else {
                Colorspace::YCbCr
            };
            let bytes = jpeg(subsamp, colorspace);
            let header = FrameHeader::parse(&bytes).unwrap();
            assert_eq!(header.subsampling(), expected, "{subsamp:?}");
            assert_eq!((header.width, header.height, header.marker), (24, 16, 0xC0));
            assert_eq!(turbojpeg::read_header(&bytes).unwrap().subsamp, subsamp);
        }
    }

    #[test]
    fn the_colour_space_is_the_one_libjpeg_turbo_assumes() {
        let ycc = jpeg(Subsamp::Sub2x2, Colorspace::YCbCr);
        let rgb = jpeg(Subsamp::None, Colorspace::RGB);
        let cases = [
            (ycc.clone(), true),
            (without_jfif(&ycc), true),
            (with_adobe(&without_jfif(&ycc), 1), true),
            (with_adobe(&without_jfif(&ycc), 0), false),
            // JFIF wins over Adobe's flag.
            (with_adobe(&ycc, 0), true),
            (rgb.clone(), false),
            (without_jfif(&rgb), false),
        ];
        for (i, (bytes, ycbcr)) in cases.iter().enumerate() {
            let header = FrameHeader::parse(bytes).unwrap();
            assert_eq!(header.is_ycbcr(), *ycbcr, "case {i}");
            let turbo = turbojpeg::read_header(bytes).unwrap().colorspace;
            assert_eq!(
                turbo == Colorspace::YCbCr,
                *ycbcr,
                "case {i}: libjpeg-turbo says {turbo:?}"
            );
            if !ycbcr {
                assert_eq!(header.subsampling(), None, "case {i}: RGB frames stay on the CPU");
            }
        }
    }

    #[test]
    fn truncated_or_frameless_headers_are_none() {
        let bytes = jpeg(Subsamp::Sub2x2, Colorspace::YCbCr);
        let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        assert_eq!(
            FrameHeader::parse(&bytes[..sof + 6]),
            None,
            "cut inside the frame header"
        );
        let cut = FrameHeader::parse(&bytes[..sof + 40]).unwrap();
        assert_eq!((cut.width, cut.height), (24, 16), "cut after it");
        assert_eq!(FrameHeader::parse(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]), None);
        assert_eq!(FrameHeader::parse(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00]), None);
    }

    #[test]
    fn only_layouts_the_gpu_reproduces_are_routed_to_it() {
        use crate::{baseline_jpeg, DecodeLimits};
        let limits = DecodeLimits::default();
        let gpu = |bytes: &[u8]| baseline_jpeg(bytes, limits).unwrap().is_some();
        assert!(gpu(&jpeg(Subsamp::Sub2x2, Colorspace::YCbCr)));
        assert!(gpu(&jpeg(Subsamp::Sub1x2, Colorspace::YCbCr)));
        assert!(gpu(&jpeg(Subsamp::Gray, Colorspace::Gray)));
        assert!(!gpu(&jpeg(Subsamp::Sub4x1, Colorspace::YCbCr)), "4:1:1: CPU");
        assert!(!gpu(&jpeg(Subsamp::None, Colorspace::RGB)), "RGB-coded: CPU");
    }
}
