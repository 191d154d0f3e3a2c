//! Decoding and letterboxing on the blocking pool, into pooled canvases. Each pool thread
//! keeps its own scratch canvas and decode buffer from one image to the next.

use std::cell::RefCell;

use peregrine_types::DetectParams;
use peregrine_vision::{decode_image_with, DecodeOptions, ImageView, Letterbox, LetterboxCanvas};

use crate::request::RequestError;
use crate::shared::Shared;
use crate::slot::Slot;

/// A letterboxed image ready for the queue, with the picture's own size (which the result
/// reports).
pub(crate) struct Prepared {
    pub canvas: Vec<u8>,
    pub letterbox: Letterbox,
    pub width: u32,
    pub height: u32,
}

impl Prepared {
    pub fn into_slot(self, params: DetectParams) -> Slot {
        Slot::Canvas {
            canvas: self.canvas,
            letterbox: self.letterbox,
            params,
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<LetterboxCanvas> = RefCell::new(LetterboxCanvas::new());
    /// The last decoded image's pixel memory, for the next image this thread decodes.
    static DECODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Largest decode buffer a thread keeps between images (a 4K frame is 24 MiB); the memory
/// of a rare larger image is given back at once.
const KEEP_DECODE_BUFFER_BYTES: usize = 32 << 20;

fn keep_decode_buffer(buffer: Vec<u8>) {
    if buffer.capacity() <= KEEP_DECODE_BUFFER_BYTES {
        DECODED.with(|b| *b.borrow_mut() = buffer);
    }
}

/// Decode and letterbox on the blocking pool, into a pooled canvas. The decoded pixels go
/// into this thread's own buffer, reused from image to image.
pub(crate) fn prepare(shared: &Shared, image: &[u8]) -> Result<Prepared, RequestError> {
    let spec = &shared.spec;
    let mut options = DecodeOptions {
        buffer: DECODED.with(|b| std::mem::take(&mut *b.borrow_mut())),
        fit_within: shared
            .config
            .jpeg_dct_scaling
            .then_some((spec.input_width, spec.input_height)),
    };
    let decoded = decode_image_with(image, shared.config.decode_limits, &mut options);
    // On an error the buffer is still in `options`; on success it is the image's.
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => {
            keep_decode_buffer(options.buffer);
            return Err(e.into());
        }
    };
    let size = (decoded.width() as usize, decoded.height() as usize);
    let prepared = letterbox_into_pool(shared, ImageView::from(&decoded.rgb), size);
    keep_decode_buffer(decoded.rgb.into_raw());
    Ok(prepared)
}

/// Letterboxes `image` (a picture of `size`, possibly held at reduced scale) into a pooled
/// canvas, with this thread's scratch.
pub(crate) fn letterbox_into_pool(shared: &Shared, image: ImageView<'_>, size: (usize, usize)) -> Prepared {
    let mut canvas = shared.canvas();
    let spec = &shared.spec;
    let letterbox = SCRATCH.with(|s| {
        s.borrow_mut()
            .fill_into_from(image, size, spec.input_width, spec.input_height, &mut canvas)
    });
    if let Some(sampler) = shared.sampler.get() {
        sampler.offer(&canvas);
    }
    Prepared {
        canvas,
        letterbox,
        width: size.0 as u32,
        height: size.1 as u32,
    }
}
