//! What nvJPEG's header read says about an image's planes, and how the kernels take them.
//!
//! nvJPEG decodes into planar Y/Cb/Cr at each component's own resolution
//! (`NVJPEG_OUTPUT_YUV`), and the `ycc_to_rgb` kernel upsamples and converts them with
//! libjpeg-turbo's arithmetic. That covers the layouts `ChromaSubsampling` reproduces; the
//! engine sends no others (`peregrine_vision::baseline_jpeg`), and one that arrives anyway
//! is an error, so that the batch is decoded on the CPU rather than differently.

use std::ffi::c_int;

use peregrine_vision::jpeg_planes::ChromaSubsampling;

use super::kernel::KernelLayout;
use super::CudaError;

/// The image header as nvJPEG reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    pub width: usize,
    pub height: usize,
    pub components: usize,
    /// `nvjpegChromaSubsampling_t`.
    pub subsampling: c_int,
    /// The size nvJPEG gives the second component's plane (0 x 0 for gray).
    pub chroma_size: (usize, usize),
}

/// `nvjpegChromaSubsampling_t` (nvjpeg.h).
fn nvjpeg_subsampling_name(code: c_int) -> &'static str {
    match code {
        0 => "4:4:4",
        1 => "4:2:2",
        2 => "4:2:0",
        3 => "4:4:0",
        4 => "4:1:1",
        5 => "4:1:0",
        6 => "gray",
        7 => "4:1:0 (vertical)",
        _ => "unknown",
    }
}

impl JpegInfo {
    /// The layout the kernel reproduces for this image, checked against the plane sizes
    /// nvJPEG reported.
    pub fn layout(&self) -> Result<ChromaSubsampling, CudaError> {
        let subsampling = match (self.components, self.subsampling) {
            (1, _) | (_, 6) => ChromaSubsampling::Gray,
            (3, 0) => ChromaSubsampling::None,
            (3, 1) => ChromaSubsampling::Half,
            (3, 2) => ChromaSubsampling::Quarter,
            (3, 3) => ChromaSubsampling::HalfRows,
            (n, code) => {
                return Err(CudaError(format!(
                    "a {n}-component {} JPEG: decoded on the CPU (the GPU path reproduces \
                     libjpeg-turbo for gray, 4:4:4, 4:2:2, 4:2:0 and 4:4:0 only)",
                    nvjpeg_subsampling_name(code)
                )))
            }
        };
        let expected = subsampling.chroma_size(self.width, self.height);
        if subsampling != ChromaSubsampling::Gray && expected != self.chroma_size {
            return Err(CudaError(format!(
                "nvJPEG gives a {}x{} {} JPEG {}x{} chroma planes; libjpeg-turbo has {}x{}",
                self.width,
                self.height,
                nvjpeg_subsampling_name(self.subsampling),
                self.chroma_size.0,
                self.chroma_size.1,
                expected.0,
                expected.1
            )));
        }
        Ok(subsampling)
    }

    /// Bytes for the three planes, packed (each row as wide as its plane). Gray images get
    /// full-size chroma planes too: what nvJPEG writes into them is not read.
    pub fn plane_bytes(&self, subsampling: ChromaSubsampling) -> usize {
        let (cw, ch) = chroma_allocation(subsampling, self.width, self.height);
        self.width * self.height + 2 * cw * ch
    }
}

/// The chroma planes' allocated size: the real one, or the luma's for gray.
pub(crate) fn chroma_allocation(
    subsampling: ChromaSubsampling,
    width: usize,
    height: usize,
) -> (usize, usize) {
    match subsampling {
        ChromaSubsampling::Gray => (width, height),
        other => other.chroma_size(width, height),
    }
}

pub(crate) fn kernel_layout(subsampling: ChromaSubsampling) -> KernelLayout {
    match subsampling {
        ChromaSubsampling::Gray => KernelLayout::Gray,
        ChromaSubsampling::None => KernelLayout::Full,
        ChromaSubsampling::Half => KernelLayout::Half,
        ChromaSubsampling::Quarter => KernelLayout::Quarter,
        ChromaSubsampling::HalfRows => KernelLayout::HalfRows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(components: usize, subsampling: c_int, chroma_size: (usize, usize)) -> JpegInfo {
        JpegInfo {
            width: 33,
            height: 31,
            components,
            subsampling,
            chroma_size,
        }
    }

    #[test]
    fn nvjpeg_layouts_map_to_libjpeg_turbos_and_others_are_refused() {
        assert_eq!(info(3, 2, (17, 16)).layout().unwrap(), ChromaSubsampling::Quarter);
        assert_eq!(info(3, 1, (17, 31)).layout().unwrap(), ChromaSubsampling::Half);
        assert_eq!(
            info(3, 3, (33, 16)).layout().unwrap(),
            ChromaSubsampling::HalfRows
        );
        assert_eq!(info(3, 0, (33, 31)).layout().unwrap(), ChromaSubsampling::None);
        assert_eq!(info(1, 6, (0, 0)).layout().unwrap(), ChromaSubsampling::Gray);
        let e = info(3, 4, (9, 31)).layout().unwrap_err();
        assert!(e.to_string().contains("4:1:1 JPEG: decoded on the CPU"), "{e}");
        // Planes of another size than libjpeg-turbo's: the arithmetic would not match.
        let e = info(3, 2, (16, 16)).layout().unwrap_err();
        assert!(
            e.to_string()
                .contains("16x16 chroma planes; libjpeg-turbo has 17x16"),
            "{e}"
        );
    }

    #[test]
    fn planes_are_packed_and_gray_gets_room_for_chroma() {
        let i = info(3, 2, (17, 16));
        assert_eq!(i.plane_bytes(ChromaSubsampling::Quarter), 33 * 31 + 2 * 17 * 16);
        assert_eq!(i.plane_bytes(ChromaSubsampling::Gray), 3 * 33 * 31);
        assert_eq!(kernel_layout(ChromaSubsampling::HalfRows), KernelLayout::HalfRows);
    }
}
