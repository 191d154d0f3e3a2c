//! Function pointers into libcudart, libnvjpeg, the CUDA driver and NVRTC, resolved once.

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

pub(crate) const CUDA_SUCCESS: i32 = 0;

/// A `cudaStream_t`.
#[derive(Debug)]
pub struct Stream(pub(crate) *mut c_void);

// SAFETY: CUDA streams may be used from any host thread.
unsafe impl Send for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(api) = super::api() {
            // SAFETY: the stream was created by cudaStreamCreateWithFlags and is destroyed once.
            unsafe { (api.cuda_stream_destroy)(self.0) };
        }
    }
}

/// `nvjpegImage_t`: up to four planes; interleaved RGB uses the first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvjpegImage {
    pub channel: [*mut u8; 4],
    pub pitch: [usize; 4],
}

pub(crate) type Handle = *mut c_void;

pub(crate) struct Api {
    _libs: Vec<Library>,
    pub cuda_get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    pub cuda_set_device: unsafe extern "C" fn(c_int) -> c_int,
    pub cuda_device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int,
    pub cuda_malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    pub cuda_free: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub cuda_stream_create_with_flags: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
    pub cuda_stream_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub cuda_stream_synchronize: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub cuda_memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> c_int,
    pub cuda_memcpy_2d_async: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *const c_void,
        usize,
        usize,
        usize,
        c_int,
        *mut c_void,
    ) -> c_int,
    pub cuda_memset_async: unsafe extern "C" fn(*mut c_void, c_int, usize, *mut c_void) -> c_int,
    pub nvjpeg_create_ex: unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle) -> c_int,
    pub nvjpeg_destroy: unsafe extern "C" fn(Handle) -> c_int,
    pub nvjpeg_jpeg_state_create: unsafe extern "C" fn(Handle, *mut Handle) -> c_int,
    pub nvjpeg_jpeg_state_destroy: unsafe extern "C" fn(Handle) -> c_int,
    pub nvjpeg_get_image_info: unsafe extern "C" fn(
        Handle,
        *const u8,
        usize,
        *mut c_int,
        *mut c_int,
        *mut c_int,
        *mut c_int,
    ) -> c_int,
    pub nvjpeg_decode_batched_initialize: unsafe extern "C" fn(Handle, Handle, c_int, c_int, c_int) -> c_int,
    #[allow(clippy::type_complexity)]
    pub nvjpeg_decode_batched_pre_allocate:
        unsafe extern "C" fn(Handle, Handle, c_int, c_int, c_int, c_int, c_int) -> c_int,
    pub nvjpeg_decode_batched: unsafe extern "C" fn(
        Handle,
        Handle,
        *const *const u8,
        *const usize,
        *mut NvjpegImage,
        *mut c_void,
    ) -> c_int,
    pub cu_init: unsafe extern "C" fn(c_uint) -> c_int,
    pub cu_get_error_string: unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int,
    pub cu_module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> c_int,
    pub cu_module_unload: unsafe extern "C" fn(Handle) -> c_int,
    pub cu_module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> c_int,
    #[allow(clippy::type_complexity)]
    pub cu_launch_kernel: unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    pub nvrtc: Nvrtc,
}

/// NVRTC, CUDA's run-time compiler: all it takes to turn the kernels' source into PTX,
/// without a driver or a GPU.
pub(crate) struct Nvrtc {
    pub nvrtc_create_program: unsafe extern "C" fn(
        *mut Handle,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    pub nvrtc_compile_program: unsafe extern "C" fn(Handle, c_int, *const *const c_char) -> c_int,
    pub nvrtc_get_ptx_size: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    pub nvrtc_get_ptx: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    pub nvrtc_get_program_log_size: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    pub nvrtc_get_program_log: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    pub nvrtc_destroy_program: unsafe extern "C" fn(*mut Handle) -> c_int,
}

/// Opens the first of `names` that loads, trying CUDA's default directory too.
fn open(names: &[&str]) -> Result<Library, String> {
    let mut last = String::new();
    for name in names {
        for candidate in [name.to_string(), format!("/usr/local/cuda/lib64/{name}")] {
            // SAFETY: loading a CUDA library runs its initialisers, which is what it is for.
            match unsafe { Library::new(&candidate) } {
                Ok(lib) => return Ok(lib),
                Err(e) => last = e.to_string(),
            }
        }
    }
    Err(format!(
        "no CUDA library {} (searched the library path and /usr/local/cuda/lib64; last error: {last}); \
         GPU decoding needs the CUDA driver and CUDA's runtime, nvJPEG and NVRTC libraries",
        names.join(" / ")
    ))
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's type is the one the CUDA headers declare for it.
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?
    };
}

impl Nvrtc {
    /// NVRTC's functions from `nvrtc`, which must outlive the result.
    pub(crate) fn from_library(nvrtc: &Library) -> Result<Self, String> {
        Ok(Self {
            nvrtc_create_program: sym!(nvrtc, "nvrtcCreateProgram"),
            nvrtc_compile_program: sym!(nvrtc, "nvrtcCompileProgram"),
            nvrtc_get_ptx_size: sym!(nvrtc, "nvrtcGetPTXSize"),
            nvrtc_get_ptx: sym!(nvrtc, "nvrtcGetPTX"),
            nvrtc_get_program_log_size: sym!(nvrtc, "nvrtcGetProgramLogSize"),
            nvrtc_get_program_log: sym!(nvrtc, "nvrtcGetProgramLog"),
            nvrtc_destroy_program: sym!(nvrtc, "nvrtcDestroyProgram"),
        })
    }
}

impl Api {
    pub(crate) fn load() -> Result<Self, String> {
        let cudart = open(&["libcudart.so.13", "libcudart.so.12", "libcudart.so"])?;
        let nvjpeg = open(&["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"])?;
        // The driver API, for the kernel NVRTC compiles at run time (no CUDA compiler is
        // needed to build Peregrine).
        let driver = open(&["libcuda.so.1", "libcuda.so"])?;
        let nvrtc = open(&["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"])?;
        let api = Self {
            cuda_get_error_string: sym!(cudart, "cudaGetErrorString"),
            cuda_set_device: sym!(cudart, "cudaSetDevice"),
            cuda_device_get_attribute: sym!(cudart, "cudaDeviceGetAttribute"),
            cuda_malloc: sym!(cudart, "cudaMalloc"),
            cuda_free: sym!(cudart, "cudaFree"),
            cuda_stream_create_with_flags: sym!(cudart, "cudaStreamCreateWithFlags"),
            cuda_stream_destroy: sym!(cudart, "cudaStreamDestroy"),
            cuda_stream_synchronize: sym!(cudart, "cudaStreamSynchronize"),
            cuda_memcpy_async: sym!(cudart, "cudaMemcpyAsync"),
            cuda_memcpy_2d_async: sym!(cudart, "cudaMemcpy2DAsync"),
            cuda_memset_async: sym!(cudart, "cudaMemsetAsync"),
            nvjpeg_create_ex: sym!(nvjpeg, "nvjpegCreateEx"),
            nvjpeg_destroy: sym!(nvjpeg, "nvjpegDestroy"),
            nvjpeg_jpeg_state_create: sym!(nvjpeg, "nvjpegJpegStateCreate"),
            nvjpeg_jpeg_state_destroy: sym!(nvjpeg, "nvjpegJpegStateDestroy"),
            nvjpeg_get_image_info: sym!(nvjpeg, "nvjpegGetImageInfo"),
            nvjpeg_decode_batched_initialize: sym!(nvjpeg, "nvjpegDecodeBatchedInitialize"),
            nvjpeg_decode_batched_pre_allocate: sym!(nvjpeg, "nvjpegDecodeBatchedPreAllocate"),
            nvjpeg_decode_batched: sym!(nvjpeg, "nvjpegDecodeBatched"),
            cu_init: sym!(driver, "cuInit"),
            cu_get_error_string: sym!(driver, "cuGetErrorString"),
            cu_module_load_data: sym!(driver, "cuModuleLoadData"),
            cu_module_unload: sym!(driver, "cuModuleUnload"),
            cu_module_get_function: sym!(driver, "cuModuleGetFunction"),
            cu_launch_kernel: sym!(driver, "cuLaunchKernel"),
            nvrtc: Nvrtc::from_library(&nvrtc)?,
            _libs: vec![cudart, nvjpeg, driver, nvrtc],
        };
        Ok(api)
    }
}
