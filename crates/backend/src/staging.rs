//! Where a batch's input is written before a run: ordinary host memory, or page-locked
//! ("pinned") host memory from the CUDA provider's allocator, which the GPU copies from by
//! DMA without the runtime staging it through a pinned bounce buffer first. Either way the
//! engine writes each image once, straight into the buffer the runtime reads.

use std::ffi::c_void;

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::Session;
use ort::session::SessionInputValue;
use ort::value::{Shape, TensorRef, TensorRefMut};

use crate::{BackendError, InputBuffer};

/// The element type of the model's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Element {
    F32,
    U8,
}

impl Element {
    pub(crate) fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::U8 => 1,
        }
    }
}

/// A pinned block, grown (never shrunk) to the largest batch asked for.
struct PinnedBlock {
    allocator: Allocator,
    info: MemoryInfo<'static>,
    ptr: *mut c_void,
    bytes: usize,
}

// SAFETY: the block is owned by this value alone and only touched through `&mut self`
// (or `&self` for the run that reads it); ONNX Runtime's allocator may be used from any
// thread.
unsafe impl Send for PinnedBlock {}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from this allocator's `alloc` and is freed once.
            unsafe { self.allocator.free(self.ptr) };
        }
    }
}

enum Memory {
    Host { f32: Vec<f32>, u8: Vec<u8> },
    Pinned(PinnedBlock),
}

pub(crate) struct Staging {
    element: Element,
    memory: Memory,
    /// Elements written for the coming run.
    len: usize,
}

impl Staging {
    pub fn host(element: Element) -> Self {
        Self {
            element,
            memory: Memory::Host {
                f32: Vec::new(),
                u8: Vec::new(),
            },
            len: 0,
        }
    }

    /// Pinned memory from `session`'s CUDA provider on `device`.
    pub fn pinned(session: &Session, element: Element, device: i32) -> Result<Self, BackendError> {
        let err = |e: ort::Error| BackendError::ModelLoad(format!("pinned input memory: {e}"));
        let info = MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            device,
            AllocatorType::Device,
            MemoryType::CPUInput,
        )
        .map_err(err)?;
        let allocator = Allocator::new(session, info.clone()).map_err(err)?;
        Ok(Self {
            element,
            memory: Memory::Pinned(PinnedBlock {
                allocator,
                info: info.to_owned(),
                ptr: std::ptr::null_mut(),
                bytes: 0,
            }),
            len: 0,
        })
    }

    pub fn is_pinned(&self) -> bool {
        matches!(self.memory, Memory::Pinned(_))
    }

    /// Elements written for the coming run.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The pinned block's address, when staging is pinned.
    pub fn pinned_ptr(&self) -> Option<*mut c_void> {
        match &self.memory {
            Memory::Pinned(block) => Some(block.ptr),
            Memory::Host { .. } => None,
        }
    }

    /// The buffer for a batch of `len` elements.
    pub fn buffer(&mut self, len: usize) -> Result<InputBuffer<'_>, BackendError> {
        self.len = len;
        let element = self.element;
        match &mut self.memory {
            Memory::Host { f32, u8 } => Ok(match element {
                Element::F32 => {
                    f32.resize(len, 0.0);
                    InputBuffer::F32(&mut f32[..len])
                }
                Element::U8 => {
                    u8.resize(len, 0);
                    InputBuffer::U8(&mut u8[..len])
                }
            }),
            Memory::Pinned(block) => {
                let bytes = len * element.size();
                if bytes > block.bytes {
                    let fresh = block
                        .allocator
                        .alloc::<u8>(bytes)
                        .map_err(|e| BackendError::Inference(format!("allocating pinned input memory: {e}")))?
                        .into_raw();
                    if !block.ptr.is_null() {
                        // SAFETY: the old block came from this allocator and nothing refers
                        // to it between runs.
                        unsafe { block.allocator.free(block.ptr) };
                    }
                    block.ptr = fresh;
                    block.bytes = bytes;
                }
                // SAFETY: the block holds at least `bytes` bytes, is CPU-accessible (pinned
                // host memory) and is borrowed mutably through `self` for as long as the
                // slice lives. CUDA's host allocations are page-aligned, so f32 alignment holds.
                Ok(unsafe {
                    match element {
                        Element::F32 => {
                            InputBuffer::F32(std::slice::from_raw_parts_mut(block.ptr.cast(), len))
                        }
                        Element::U8 => InputBuffer::U8(std::slice::from_raw_parts_mut(block.ptr.cast(), len)),
                    }
                })
            }
        }
    }

    /// Runs `session` on what was last written, as a tensor of `shape`.
    pub fn run<'s>(
        &self,
        session: &'s mut Session,
        shape: [usize; 4],
    ) -> Result<ort::session::SessionOutputs<'s>, BackendError> {
        let _nvtx = crate::nvtx::range(c"session run");
        let n: usize = shape.iter().product();
        if n != self.len {
            return Err(BackendError::InputSize { shape, len: self.len });
        }
        let fail = |e: ort::Error| BackendError::Inference(e.to_string());
        let value: SessionInputValue<'_> = match &self.memory {
            Memory::Host { f32, u8 } => match self.element {
                Element::F32 => TensorRef::from_array_view((shape, &f32[..n]))
                    .map_err(fail)?
                    .into(),
                Element::U8 => TensorRef::from_array_view((shape, &u8[..n]))
                    .map_err(fail)?
                    .into(),
            },
            Memory::Pinned(block) => {
                let dims = Shape::new(shape.iter().map(|&d| d as i64));
                // SAFETY: `ptr` holds at least `n` elements written by `buffer`, stays valid
                // until this value (which the tensor does not outlive) is dropped or asked
                // for a larger buffer, neither of which can happen during this call.
                unsafe {
                    match self.element {
                        Element::F32 => TensorRefMut::<f32>::from_raw(block.info.clone(), block.ptr, dims)
                            .map_err(fail)?
                            .into(),
                        Element::U8 => TensorRefMut::<u8>::from_raw(block.info.clone(), block.ptr, dims)
                            .map_err(fail)?
                            .into(),
                    }
                }
            }
        };
        session.run(ort::inputs![value]).map_err(fail)
    }
}
