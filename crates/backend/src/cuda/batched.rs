//! nvJPEG's batched decode states: one per batch size, each with device memory
//! pre-allocated for the largest image it has been given.
//!
//! Why: nvJPEG's batched decoder (the hardware one on A100/H100/H200) keeps its buffers per
//! position in the batch, sized for the image last decoded there. When the images of a batch
//! differ in size or subsampling from the ones before them at the same positions, it frees
//! and allocates device memory again inside `nvjpegDecodeBatched`, synchronously and image by
//! image; several decoders doing so at once wait on each other. On an H200, ten mixed photos
//! decoded to planes at about 1,100 images/s from one thread this way, one photo repeated at
//! 7,300, and the mix with room pre-allocated at 3,100 (docs/benchmarks.md, 2026-12-02).
//! `nvjpegDecodeBatchedPreAllocate` sizes the buffers once, for 4:4:4 (the most chroma) at
//! the largest image seen so far. A state's batch size is fixed when it is initialised and
//! the server's batches vary, so each batch size keeps its own state rather than
//! re-initialising (and so re-allocating) one.

use std::collections::HashMap;
use std::ffi::c_int;

use super::ffi::{Api, Handle, NvjpegImage};
use super::Stream;

/// `NVJPEG_CSS_444`: room for full-resolution chroma covers every other subsampling.
const NVJPEG_CSS_444: c_int = 0;
/// Room grows in steps of this many pixels a side, so that slightly larger images do not
/// re-allocate every time.
const ROOM_STEP: usize = 256;
/// Room is never made for more pixels than this (about 4 MP; 12 MB per image of a batch):
/// larger images still decode, with nvJPEG allocating for them itself as it would without
/// pre-allocation.
pub(crate) const MAX_ROOM_PIXELS: usize = 2048 * 2048;
/// The least room a state is given (a 1080p frame, rounded up): made at the warm-up, so that
/// camera-sized images never re-allocate a state while traffic flows (re-allocation frees
/// device memory, and `cudaFree` waits for the whole device).
const MIN_ROOM: Room = Room {
    width: 2048,
    height: 1280,
};

/// The image size a state's pre-allocated buffers hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Room {
    pub width: usize,
    pub height: usize,
}

impl Room {
    /// The room that also covers `sizes` (rounded up to `ROOM_STEP`), skipping any image
    /// that would take it past `MAX_ROOM_PIXELS`; `None` when `self` already covers them.
    pub fn grown_for(self, sizes: impl IntoIterator<Item = (usize, usize)>) -> Option<Room> {
        let step = |v: usize| v.div_ceil(ROOM_STEP) * ROOM_STEP;
        let mut room = Room {
            width: self.width.max(MIN_ROOM.width),
            height: self.height.max(MIN_ROOM.height),
        };
        for (w, h) in sizes {
            let candidate = Room {
                width: room.width.max(step(w)),
                height: room.height.max(step(h)),
            };
            if candidate.width * candidate.height <= MAX_ROOM_PIXELS {
                room = candidate;
            }
        }
        (room != self).then_some(room)
    }
}

struct State {
    state: Handle,
    /// The output format it was initialised for (`None`: not initialised).
    format: Option<c_int>,
    room: Room,
}

/// The batched states of one nvJPEG handle, by batch size.
pub(crate) struct BatchedStates {
    states: HashMap<usize, State>,
    /// Cleared when nvJPEG refuses to pre-allocate (a backend without the call): decoding
    /// goes on without it.
    preallocate: bool,
}

impl BatchedStates {
    pub fn new() -> Self {
        Self {
            states: HashMap::new(),
            preallocate: true,
        }
    }

    /// One batched decode of `images` (of the sizes `sizes`) into `outputs` as `format`, on
    /// `stream`; the nvJPEG status of the call that failed.
    #[allow(clippy::too_many_arguments)]
    pub fn decode(
        &mut self,
        api: &Api,
        handle: Handle,
        images: &[&[u8]],
        sizes: &[(usize, usize)],
        outputs: &mut [NvjpegImage],
        format: c_int,
        stream: &Stream,
    ) -> Result<(), c_int> {
        let n = images.len();
        let entry = match self.states.entry(n) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut state: Handle = std::ptr::null_mut();
                // SAFETY: writes a state for `handle`.
                let status = unsafe { (api.nvjpeg_jpeg_state_create)(handle, &mut state) };
                if status != 0 {
                    return Err(status);
                }
                v.insert(State {
                    state,
                    format: None,
                    room: Room::default(),
                })
            }
        };
        let grown = if self.preallocate {
            entry.room.grown_for(sizes.iter().copied())
        } else {
            None
        };
        if entry.format != Some(format) || grown.is_some() {
            // SAFETY: (re-)initialises this state for `n` images in `format`.
            let status =
                unsafe { (api.nvjpeg_decode_batched_initialize)(handle, entry.state, n as c_int, 1, format) };
            if status != 0 {
                entry.format = None;
                return Err(status);
            }
            entry.format = Some(format);
            let room = grown.unwrap_or(entry.room);
            if self.preallocate && room != Room::default() {
                // SAFETY: pre-allocates the state just initialised, for `n` images of at most
                // `room` in 4:4:4 and `format`.
                let status = unsafe {
                    (api.nvjpeg_decode_batched_pre_allocate)(
                        handle,
                        entry.state,
                        n as c_int,
                        room.width as c_int,
                        room.height as c_int,
                        NVJPEG_CSS_444,
                        format,
                    )
                };
                if status == 0 {
                    entry.room = room;
                } else {
                    tracing::info!(
                        status,
                        "nvJPEG cannot pre-allocate its batched decode buffers; decoding without"
                    );
                    self.preallocate = false;
                }
            }
        }
        let lengths: Vec<usize> = images.iter().map(|d| d.len()).collect();
        let data: Vec<*const u8> = images.iter().map(|d| d.as_ptr()).collect();
        // SAFETY: `data`/`lengths` describe `n` live JPEGs; each output buffer holds its
        // image at the pitches given.
        let status = unsafe {
            (api.nvjpeg_decode_batched)(
                handle,
                entry.state,
                data.as_ptr(),
                lengths.as_ptr(),
                outputs.as_mut_ptr(),
                stream.0,
            )
        };
        if status == 0 {
            Ok(())
        } else {
            Err(status)
        }
    }

    /// Destroys every state; to be called before their handle is destroyed.
    pub fn destroy(&mut self, api: &Api) {
        for (_, s) in self.states.drain() {
            // SAFETY: created in `decode`, destroyed once.
            unsafe { (api.nvjpeg_jpeg_state_destroy)(s.state) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_starts_at_a_1080p_frame_grows_in_steps_and_stops_at_the_cap() {
        let none = Room::default();
        // Any first image gets the least room, a 1080p frame's.
        assert_eq!(none.grown_for([(640, 640)]), Some(MIN_ROOM));
        let room = none.grown_for([(810, 1080), (1280, 720)]).unwrap();
        assert_eq!(room, MIN_ROOM);
        // Covered already: nothing to do, so the state is not re-initialised.
        assert_eq!(room.grown_for([(1000, 1000), (1920, 1080)]), None);
        assert_eq!(
            room.grown_for([(10, 1300)]),
            Some(Room {
                width: 2048,
                height: 1536
            })
        );
        // A 4000x3000 photo would need 12 MP of room per image: skipped, the others count.
        let grown = none.grown_for([(4000, 3000), (500, 300)]).unwrap();
        assert_eq!(grown, MIN_ROOM);
        assert_eq!(
            Room {
                width: 2048,
                height: 2048
            }
            .grown_for([(4000, 3000)]),
            None
        );
    }
}
