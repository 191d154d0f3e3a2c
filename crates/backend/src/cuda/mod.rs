//! The few CUDA, nvJPEG and NVRTC functions Peregrine calls itself, loaded at run time.
//!
//! Nothing here is linked: the build machine has no CUDA, and a CPU-only installation must
//! not need it. The libraries are opened with `dlopen` on first use, from the usual search
//! path (the GPU build of ONNX Runtime's `activate.sh` and CUDA's own installation put them
//! there) or `/usr/local/cuda/lib64`, newest major version first. A missing library or
//! symbol is an error that names it.

mod batched;
mod canvas;
pub mod capture;
mod ffi;
pub mod frames;
pub mod jpeg;
mod kernel;
mod planes;

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

pub use canvas::Placement;
pub use ffi::Stream;
use ffi::{Api, CUDA_SUCCESS};
pub use kernel::compile_check;

/// A CUDA, nvJPEG or NVRTC call that failed, or a library that could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CudaError(pub String);

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The loaded libraries, or why they could not be loaded. Every thread that reaches CUDA
/// through here is first isolated from other threads' graph captures (see [`capture`]).
pub(crate) fn api() -> Result<&'static Api, CudaError> {
    capture::isolate_this_thread();
    API.get_or_init(Api::load)
        .as_ref()
        .map_err(|e| CudaError(e.clone()))
}

pub(crate) fn check(api: &Api, what: &str, code: i32) -> Result<(), CudaError> {
    if code == CUDA_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudaGetErrorString returns a static string for any code.
    let msg = unsafe { CStr::from_ptr((api.cuda_get_error_string)(code)) };
    Err(CudaError(format!(
        "{what}: CUDA error {code} ({})",
        msg.to_string_lossy()
    )))
}

/// Device memory from `cudaMalloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: *mut c_void,
    bytes: usize,
}

// SAFETY: device memory is not tied to a host thread.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    pub fn new(bytes: usize) -> Result<Self, CudaError> {
        let api = api()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: cudaMalloc writes a device pointer into `ptr`.
        check(api, "cudaMalloc", unsafe {
            (api.cuda_malloc)(&mut ptr, bytes.max(1))
        })?;
        Ok(Self { ptr, bytes })
    }

    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: `ptr` came from cudaMalloc and is freed once.
            unsafe { (api.cuda_free)(self.ptr) };
        }
    }
}

/// Makes `device` current on the calling thread (CUDA's current device is per thread).
pub fn set_device(device: i32) -> Result<(), CudaError> {
    let api = api()?;
    // SAFETY: plain call.
    check(api, "cudaSetDevice", unsafe { (api.cuda_set_device)(device) })
}

/// A non-blocking CUDA stream of our own.
pub fn create_stream() -> Result<Stream, CudaError> {
    let api = api()?;
    let mut stream = std::ptr::null_mut();
    // SAFETY: writes a stream handle into `stream`; flag 1 = cudaStreamNonBlocking.
    check(api, "cudaStreamCreateWithFlags", unsafe {
        (api.cuda_stream_create_with_flags)(&mut stream, 1)
    })?;
    Ok(Stream(stream))
}

pub fn synchronize(stream: &Stream) -> Result<(), CudaError> {
    let api = api()?;
    // SAFETY: `stream` is a live stream.
    check(api, "cudaStreamSynchronize", unsafe {
        (api.cuda_stream_synchronize)(stream.0)
    })
}

/// Copies `bytes` from host to device (or back, by `kind`) on `stream`, asynchronously.
///
/// # Safety
/// Both pointers must be valid for `bytes` on their sides until the stream has passed the
/// copy.
pub unsafe fn copy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: CopyKind,
    stream: &Stream,
) -> Result<(), CudaError> {
    let api = api()?;
    check(api, "cudaMemcpyAsync", unsafe {
        (api.cuda_memcpy_async)(dst, src, bytes, kind as i32, stream.0)
    })
}

#[derive(Debug, Clone, Copy)]
#[repr(i32)]
pub enum CopyKind {
    HostToDevice = 1,
    DeviceToHost = 2,
    DeviceToDevice = 3,
}

#[cfg(test)]
mod tests {
    use super::jpeg::GpuJpegDecoder;

    #[test]
    fn a_machine_without_cuda_gets_an_error_naming_what_is_missing() {
        // On a GPU machine with CUDA's libraries this builds a decoder, which must then read
        // a JPEG's header; elsewhere (CI) the error must say which library is missing and
        // what GPU decoding needs, rather than crash.
        match GpuJpegDecoder::new(0) {
            Ok(decoder) => {
                let info = decoder.info(&peregrine_vision::gray_jpeg(24, 16)).unwrap();
                assert_eq!((info.width, info.height), (24, 16));
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("no CUDA library libcudart"), "{e}");
                assert!(e.contains("GPU decoding needs the CUDA driver"), "{e}");
            }
        }
    }
}
