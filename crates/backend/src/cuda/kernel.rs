//! The image kernels, compiled by NVRTC when first needed.
//!
//! - `ycc_to_rgb`: a JPEG's Y/Cb/Cr planes (as nvJPEG decodes them, each at its own
//!   resolution) to interleaved RGB with libjpeg-turbo's own arithmetic: its "fancy"
//!   triangular chroma upsampling and its fixed-point colour tables (built on the host by
//!   `peregrine_vision::jpeg_planes::YccToRgb`). `Plane::upsampled` in that module is
//!   `upsampled` here, line for line, and is checked in CI against libjpeg-turbo's decode.
//! - `letterbox_bilinear`: exactly the integer arithmetic of the CPU letterbox (OpenCV's
//!   fixed-point bilinear, see `peregrine_vision::resample_tables`), from tables built on the
//!   host.
//!
//! Given the same IDCT output, canvases made on the GPU are the CPU's, bit for bit.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex, PoisonError};

use peregrine_vision::yuv::Nv12Image;

use super::ffi::{Handle, Nvrtc};
use super::{api, CudaError, Stream};

/// `ChromaSubsampling` as the kernel numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum KernelLayout {
    Gray = 0,
    Full = 1,
    Half = 2,
    Quarter = 3,
    HalfRows = 4,
}

/// The kernels' CUDA source, compiled by NVRTC at run time (and, in the tests, by the host's
/// C++ compiler to check its arithmetic without a GPU).
const SOURCE: &str = include_str!("image_kernels.cu");

fn driver_check(what: &str, code: i32) -> Result<(), CudaError> {
    if code == 0 {
        return Ok(());
    }
    let mut msg: *const c_char = std::ptr::null();
    if let Ok(api) = api() {
        // SAFETY: writes a pointer to a static string (or leaves it null).
        unsafe { (api.cu_get_error_string)(code, &mut msg) };
    }
    let text = if msg.is_null() {
        "unknown".into()
    } else {
        // SAFETY: a static NUL-terminated string from the driver.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy()
    };
    Err(CudaError(format!("{what}: CUDA driver error {code} ({text})")))
}

/// The compiled kernels, loaded into the current context.
pub struct ImageKernels {
    module: Handle,
    letterbox: Handle,
    ycc_to_rgb: Handle,
    nv12_to_rgb: Handle,
    letterbox_nv12: Handle,
}

// SAFETY: modules and functions belong to the context, not to a host thread.
unsafe impl Send for ImageKernels {}

impl Drop for ImageKernels {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: loaded in `compile`, unloaded once.
            unsafe { (api.cu_module_unload)(self.module) };
        }
    }
}

/// PTX already compiled in this process, by compute capability. Every GPU JPEG decoder
/// (one per session: instances x batch sizes, 24 for 8 instances and 3 sizes) needs the
/// same kernels; NVRTC runs once and each decoder only loads the result.
static PTX: Mutex<Vec<(ComputeCapability, Arc<Vec<u8>>)>> = Mutex::new(Vec::new());

/// A GPU's compute capability, major and minor.
type ComputeCapability = (i32, i32);

/// The kernels' PTX for compute capability `major.minor`, compiled on first use.
fn ptx_for(major: i32, minor: i32) -> Result<Arc<Vec<u8>>, CudaError> {
    // Held while compiling, so that decoders built at once compile only once.
    let mut cache = PTX.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, ptx)) = cache.iter().find(|(arch, _)| *arch == (major, minor)) {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(compile_ptx(&api()?.nvrtc, major, minor)?);
    cache.push(((major, minor), ptx.clone()));
    Ok(ptx)
}

/// Compiles the kernels with the NVRTC library at `library` alone (no driver, no GPU) for
/// `compute_{major}{minor}` and returns the PTX: what a machine without a GPU can check of
/// them (the backend's tests do, with the NVRTC the test setup installs).
pub fn compile_check(library: &std::path::Path, major: i32, minor: i32) -> Result<Vec<u8>, CudaError> {
    // SAFETY: loading NVRTC runs its initialisers, which is what it is for.
    let lib = unsafe { libloading::Library::new(library) }
        .map_err(|e| CudaError(format!("NVRTC at {}: {e}", library.display())))?;
    let nvrtc = Nvrtc::from_library(&lib).map_err(CudaError)?;
    compile_ptx(&nvrtc, major, minor)
}

/// Runs NVRTC over the kernels' source for `compute_{major}{minor}`.
fn compile_ptx(api: &Nvrtc, major: i32, minor: i32) -> Result<Vec<u8>, CudaError> {
    compile_source(api, SOURCE, major, minor)
}

/// Runs NVRTC over `source` for `compute_{major}{minor}`.
fn compile_source(api: &Nvrtc, source: &str, major: i32, minor: i32) -> Result<Vec<u8>, CudaError> {
    let nvrtc = |what: &str, code: i32| {
        if code == 0 {
            Ok(())
        } else {
            Err(CudaError(format!("{what}: NVRTC error {code}")))
        }
    };
    let source = CString::new(source).expect("no NUL in the source");
    let name = CString::new("image_kernels.cu").expect("no NUL");
    let mut program: Handle = std::ptr::null_mut();
    // SAFETY: creates a program from NUL-terminated strings; no headers.
    nvrtc("nvrtcCreateProgram", unsafe {
        (api.nvrtc_create_program)(
            &mut program,
            source.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let arch = CString::new(format!("--gpu-architecture=compute_{major}{minor}")).expect("no NUL");
    let options = [arch.as_ptr()];
    // SAFETY: `program` is live; the options are NUL-terminated strings.
    let compiled = unsafe { (api.nvrtc_compile_program)(program, options.len() as i32, options.as_ptr()) };
    let result = if compiled != 0 {
        let mut size = 0;
        // SAFETY: reads the log of a live program into a buffer of its size.
        let log = unsafe {
            (api.nvrtc_get_program_log_size)(program, &mut size);
            let mut log = vec![0u8; size.max(1)];
            (api.nvrtc_get_program_log)(program, log.as_mut_ptr().cast());
            String::from_utf8_lossy(&log).trim_end_matches('\0').to_string()
        };
        Err(CudaError(format!(
            "compiling the image kernels: NVRTC error {compiled}: {log}"
        )))
    } else {
        let mut size = 0;
        // SAFETY: as above, for the PTX.
        unsafe {
            nvrtc("nvrtcGetPTXSize", (api.nvrtc_get_ptx_size)(program, &mut size))?;
            let mut ptx = vec![0u8; size.max(1)];
            nvrtc(
                "nvrtcGetPTX",
                (api.nvrtc_get_ptx)(program, ptx.as_mut_ptr().cast()),
            )?;
            Ok(ptx)
        }
    };
    // SAFETY: destroys the program once.
    unsafe { (api.nvrtc_destroy_program)(&mut program) };
    result
}

impl ImageKernels {
    /// The kernels for `device`'s compute capability, loaded into the calling thread's
    /// current context (which should be `device`'s).
    pub fn for_device(device: i32) -> Result<Self, CudaError> {
        let api = api()?;
        let attr = |a: i32| -> Result<i32, CudaError> {
            let mut v = 0;
            // SAFETY: writes one attribute value.
            super::check(api, "cudaDeviceGetAttribute", unsafe {
                (api.cuda_device_get_attribute)(&mut v, a, device)
            })?;
            Ok(v)
        };
        // cudaDevAttrComputeCapabilityMajor / Minor (driver_types.h).
        Self::compile(attr(75)?, attr(76)?)
    }

    /// Compiles the kernels for compute capability `major.minor` (once per process: see
    /// [`ptx_for`]) and loads them into the calling thread's current context.
    pub fn compile(major: i32, minor: i32) -> Result<Self, CudaError> {
        let api = api()?;
        // SAFETY: cuInit may be called any number of times.
        driver_check("cuInit", unsafe { (api.cu_init)(0) })?;
        let ptx = ptx_for(major, minor)?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: `ptx` is NUL-terminated PTX text, JIT-compiled by the driver.
        driver_check("cuModuleLoadData", unsafe {
            (api.cu_module_load_data)(&mut module, ptx.as_ptr().cast())
        })?;
        let function = |name: &str| -> Result<Handle, CudaError> {
            let cname = CString::new(name).expect("no NUL");
            let mut function: Handle = std::ptr::null_mut();
            // SAFETY: looks the kernel up in the module just loaded.
            driver_check("cuModuleGetFunction", unsafe {
                (api.cu_module_get_function)(&mut function, module, cname.as_ptr())
            })?;
            Ok(function)
        };
        let names = [
            "letterbox_bilinear",
            "ycc_to_rgb",
            "nv12_to_rgb",
            "letterbox_nv12",
        ];
        match names.map(function) {
            [Ok(letterbox), Ok(ycc_to_rgb), Ok(nv12_to_rgb), Ok(letterbox_nv12)] => Ok(Self {
                module,
                letterbox,
                ycc_to_rgb,
                nv12_to_rgb,
                letterbox_nv12,
            }),
            results => {
                let e = results
                    .into_iter()
                    .find_map(Result::err)
                    .expect("one lookup failed");
                // SAFETY: unload what was loaded.
                unsafe { (api.cu_module_unload)(module) };
                Err(e)
            }
        }
    }

    /// Resamples `src` (RGB rows of `src_pitch` bytes) into the `scaled_w` x `scaled_h`
    /// region at `dst` (rows of `dst_pitch` bytes), with the tables (device memory, four
    /// i32 per column and per row), on `stream`.
    ///
    /// # Safety
    /// Every pointer must be device memory covering what the tables and sizes address.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn letterbox(
        &self,
        src: *const u8,
        src_pitch: usize,
        columns: *const i32,
        rows: *const i32,
        scaled: (usize, usize),
        dst: *mut u8,
        dst_pitch: usize,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let _nvtx = crate::nvtx::range(c"letterbox kernel");
        let (mut src, mut columns, mut rows, mut dst) = (src, columns, rows, dst);
        let (mut src_pitch, mut scaled_w, mut scaled_h, mut dst_pitch) = (
            src_pitch as i32,
            scaled.0 as i32,
            scaled.1 as i32,
            dst_pitch as i32,
        );
        let mut params: [*mut c_void; 8] = [
            (&mut src as *mut *const u8).cast(),
            (&mut src_pitch as *mut i32).cast(),
            (&mut columns as *mut *const i32).cast(),
            (&mut rows as *mut *const i32).cast(),
            (&mut scaled_w as *mut i32).cast(),
            (&mut scaled_h as *mut i32).cast(),
            (&mut dst as *mut *mut u8).cast(),
            (&mut dst_pitch as *mut i32).cast(),
        ];
        // SAFETY: the parameters match the kernel's signature; the caller vouches for the
        // memory.
        unsafe { launch(self.letterbox, scaled, &mut params, stream) }
    }

    /// Converts `planes` to RGB into the `width` x `height` region at `dst` (rows of
    /// `dst_pitch` bytes), with the colour tables at `tables` (device memory, 4 x 256 i32),
    /// on `stream`.
    ///
    /// # Safety
    /// The planes, tables and destination must be device memory covering what they address.
    pub unsafe fn ycc_to_rgb(
        &self,
        planes: &DevicePlanes,
        tables: *const i32,
        dst: *mut u8,
        dst_pitch: usize,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let (mut luma, mut cb, mut cr, mut tables, mut dst) =
            (planes.luma, planes.cb, planes.cr, tables, dst);
        let [mut luma_pitch, mut chroma_pitch, mut chroma_w, mut chroma_h, mut width, mut height, mut dst_pitch] =
            [
                planes.luma_pitch,
                planes.chroma_pitch,
                planes.chroma_size.0,
                planes.chroma_size.1,
                planes.size.0,
                planes.size.1,
                dst_pitch,
            ]
            .map(|v| v as i32);
        let mut layout = planes.layout as i32;
        let mut params: [*mut c_void; 13] = [
            (&mut luma as *mut *const u8).cast(),
            (&mut luma_pitch as *mut i32).cast(),
            (&mut cb as *mut *const u8).cast(),
            (&mut cr as *mut *const u8).cast(),
            (&mut chroma_pitch as *mut i32).cast(),
            (&mut chroma_w as *mut i32).cast(),
            (&mut chroma_h as *mut i32).cast(),
            (&mut layout as *mut i32).cast(),
            (&mut tables as *mut *const i32).cast(),
            (&mut width as *mut i32).cast(),
            (&mut height as *mut i32).cast(),
            (&mut dst as *mut *mut u8).cast(),
            (&mut dst_pitch as *mut i32).cast(),
        ];
        // SAFETY: the parameters match the kernel's signature; the caller vouches for the
        // memory.
        unsafe { launch(self.ycc_to_rgb, planes.size, &mut params, stream) }
    }
}

impl ImageKernels {
    /// Converts `image` (NV12 in device memory) to RGB into the `width` x `height` region
    /// at `dst` (rows of `dst_pitch` bytes), on `stream`.
    ///
    /// # Safety
    /// The image's planes and the destination must be device memory covering what they
    /// address, and the planes must not change until the stream has run the kernel.
    pub unsafe fn nv12_to_rgb(
        &self,
        image: &Nv12Image,
        dst: *mut u8,
        dst_pitch: usize,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let _nvtx = crate::nvtx::range(c"nv12 kernel");
        let mut args = Nv12Args::new(image);
        let [mut width, mut height, mut dst_pitch] = [image.width, image.height, dst_pitch].map(|v| v as i32);
        let mut dst = dst;
        let mut params = args.params();
        params.splice(
            4..4,
            [(&mut width as *mut i32).cast(), (&mut height as *mut i32).cast()],
        );
        params.extend([
            (&mut dst as *mut *mut u8).cast(),
            (&mut dst_pitch as *mut i32).cast(),
        ]);
        // SAFETY: the parameters match the kernel's signature (a device address is a
        // 64-bit pointer parameter); the caller vouches for the memory.
        unsafe { launch(self.nv12_to_rgb, (image.width, image.height), &mut params, stream) }
    }

    /// Converts and resamples `image` (NV12 in device memory) into the `scaled_w` x
    /// `scaled_h` region at `dst` (rows of `dst_pitch` bytes) with the tables (device
    /// memory, four i32 per column and per row, as for [`Self::letterbox`]), on `stream`.
    ///
    /// # Safety
    /// As [`Self::nv12_to_rgb`], and the tables must cover the region.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn letterbox_nv12(
        &self,
        image: &Nv12Image,
        columns: *const i32,
        rows: *const i32,
        scaled: (usize, usize),
        dst: *mut u8,
        dst_pitch: usize,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let _nvtx = crate::nvtx::range(c"nv12 letterbox kernel");
        let mut args = Nv12Args::new(image);
        let (mut columns, mut rows, mut dst) = (columns, rows, dst);
        let [mut scaled_w, mut scaled_h, mut dst_pitch] = [scaled.0, scaled.1, dst_pitch].map(|v| v as i32);
        let mut params = args.params();
        params.extend([
            (&mut columns as *mut *const i32).cast(),
            (&mut rows as *mut *const i32).cast(),
            (&mut scaled_w as *mut i32).cast(),
            (&mut scaled_h as *mut i32).cast(),
            (&mut dst as *mut *mut u8).cast(),
            (&mut dst_pitch as *mut i32).cast(),
        ]);
        // SAFETY: the parameters match the kernel's signature; the caller vouches for the
        // memory.
        unsafe { launch(self.letterbox_nv12, scaled, &mut params, stream) }
    }
}

/// The parameters every NV12 kernel starts with: the planes' four, then the six
/// coefficients.
struct Nv12Args {
    luma: u64,
    luma_pitch: i32,
    chroma: u64,
    chroma_pitch: i32,
    coefficients: [i32; 6],
}

impl Nv12Args {
    fn new(image: &Nv12Image) -> Self {
        Self {
            luma: image.luma,
            luma_pitch: image.luma_pitch as i32,
            chroma: image.chroma,
            chroma_pitch: image.chroma_pitch as i32,
            coefficients: image.conversion.kernel_coefficients(),
        }
    }

    /// Pointers to the parameters, in the kernels' order; valid while `self` is.
    fn params(&mut self) -> Vec<*mut c_void> {
        let mut params: Vec<*mut c_void> = vec![
            (&mut self.luma as *mut u64).cast(),
            (&mut self.luma_pitch as *mut i32).cast(),
            (&mut self.chroma as *mut u64).cast(),
            (&mut self.chroma_pitch as *mut i32).cast(),
        ];
        params.extend(
            self.coefficients
                .iter_mut()
                .map(|c| (c as *mut i32).cast::<c_void>()),
        );
        params
    }
}

/// One decoded JPEG's planes in device memory.
#[derive(Debug, Clone, Copy)]
pub struct DevicePlanes {
    pub size: (usize, usize),
    pub layout: KernelLayout,
    pub luma: *const u8,
    pub luma_pitch: usize,
    pub cb: *const u8,
    pub cr: *const u8,
    pub chroma_pitch: usize,
    pub chroma_size: (usize, usize),
}

/// Launches `function` with one thread per pixel of a `size` region.
///
/// # Safety
/// `params` must match the kernel's parameters; what they point to must stay valid until
/// the call returns (the driver copies them at launch).
unsafe fn launch(
    function: Handle,
    size: (usize, usize),
    params: &mut [*mut c_void],
    stream: &Stream,
) -> Result<(), CudaError> {
    let api = api()?;
    let (bx, by) = (32u32, 8u32);
    let grid_x = (size.0 as u32).div_ceil(bx);
    let grid_y = (size.1 as u32).div_ceil(by);
    // SAFETY: as the caller vouches.
    driver_check("cuLaunchKernel", unsafe {
        (api.cu_launch_kernel)(
            function,
            grid_x,
            grid_y,
            1,
            bx,
            by,
            1,
            0,
            stream.0,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
