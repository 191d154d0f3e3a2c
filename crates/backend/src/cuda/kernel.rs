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

use super::ffi::{Api, Handle};
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

const SOURCE: &str = r#"
// libjpeg-turbo's upsampled chroma sample for full-resolution pixel (x, y) of a plane of
// w x h samples (jdsample.c: h2v1, h1v2 and h2v2 fancy upsampling; replication where the
// plane has at most 2 columns and the upsampling is horizontal).
__device__ __forceinline__ int upsampled(const unsigned char* p, int pitch, int w, int h,
                                         int layout, int x, int y)
{
    int hf = (layout == 2 || layout == 3) ? 2 : 1;
    int vf = (layout == 3 || layout == 4) ? 2 : 1;
    int cx = x / hf, cy = y / vf;
    bool fancy = w > 2;
    int nx = (x & 1) ? min(cx + 1, w - 1) : max(cx - 1, 0);
    int ny = (y & 1) ? min(cy + 1, h - 1) : max(cy - 1, 0);
    const unsigned char* row = p + (size_t)cy * pitch;
    const unsigned char* other = p + (size_t)ny * pitch;
    switch (layout) {
    case 2:
        if (!fancy) return row[cx];
        return (3 * row[cx] + row[nx] + ((x & 1) ? 2 : 1)) >> 2;
    case 4:
        return (3 * row[cx] + other[cx] + ((y & 1) ? 2 : 1)) >> 2;
    case 3: {
        if (!fancy) return row[cx];
        int near_sum = 3 * row[cx] + other[cx];
        int far_sum = 3 * row[nx] + other[nx];
        return (3 * near_sum + far_sum + ((x & 1) ? 7 : 8)) >> 4;
    }
    default:
        return row[x];
    }
}

// Tables: Cr->R, Cb->B, Cr->G, Cb->G (256 each), jdcolor.c's build_ycc_rgb_table.
extern "C" __global__ void ycc_to_rgb(
    const unsigned char* luma, int luma_pitch,
    const unsigned char* cb, const unsigned char* cr, int chroma_pitch, int chroma_w, int chroma_h,
    int layout, const int* tables, int width, int height,
    unsigned char* dst, int dst_pitch)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    int l = luma[(size_t)y * luma_pitch + x];
    unsigned char* o = dst + (size_t)y * dst_pitch + 3 * x;
    if (layout == 0) {
        o[0] = o[1] = o[2] = (unsigned char)l;
        return;
    }
    int b = upsampled(cb, chroma_pitch, chroma_w, chroma_h, layout, x, y);
    int r = upsampled(cr, chroma_pitch, chroma_w, chroma_h, layout, x, y);
    int red = l + tables[r];
    int green = l + ((tables[768 + b] + tables[512 + r]) >> 16);
    int blue = l + tables[256 + b];
    o[0] = (unsigned char)min(max(red, 0), 255);
    o[1] = (unsigned char)min(max(green, 0), 255);
    o[2] = (unsigned char)min(max(blue, 0), 255);
}

extern "C" __global__ void letterbox_bilinear(
    const unsigned char* src, int src_pitch,
    const int* columns, const int* rows, int scaled_w, int scaled_h,
    unsigned char* dst, int dst_pitch)
{
    int dx = blockIdx.x * blockDim.x + threadIdx.x;
    int dy = blockIdx.y * blockDim.y + threadIdx.y;
    if (dx >= scaled_w || dy >= scaled_h) return;
    const int* x = columns + 4 * dx;
    const int* y = rows + 4 * dy;
    const unsigned char* r0 = src + (size_t)y[0] * src_pitch;
    const unsigned char* r1 = src + (size_t)y[1] * src_pitch;
    unsigned char* o = dst + (size_t)dy * dst_pitch + 3 * dx;
    for (int c = 0; c < 3; ++c) {
        short a = (short)(((int)r0[x[0] + c] * x[2] + (int)r0[x[1] + c] * x[3]) >> 4);
        short b = (short)(((int)r1[x[0] + c] * x[2] + (int)r1[x[1] + c] * x[3]) >> 4);
        int v = ((((int)a * y[2]) >> 16) + (((int)b * y[3]) >> 16) + 2) >> 2;
        o[c] = (unsigned char)min(max(v, 0), 255);
    }
}
"#;

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
    let ptx = Arc::new(compile_ptx(api()?, major, minor)?);
    cache.push(((major, minor), ptx.clone()));
    Ok(ptx)
}

/// Runs NVRTC over the kernels' source for `compute_{major}{minor}`.
fn compile_ptx(api: &Api, major: i32, minor: i32) -> Result<Vec<u8>, CudaError> {
    let nvrtc = |what: &str, code: i32| {
        if code == 0 {
            Ok(())
        } else {
            Err(CudaError(format!("{what}: NVRTC error {code}")))
        }
    };
    let source = CString::new(SOURCE).expect("no NUL in the source");
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
        match (function("letterbox_bilinear"), function("ycc_to_rgb")) {
            (Ok(letterbox), Ok(ycc_to_rgb)) => Ok(Self {
                module,
                letterbox,
                ycc_to_rgb,
            }),
            (Err(e), _) | (_, Err(e)) => {
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
