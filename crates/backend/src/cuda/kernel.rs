//! The letterbox resampling kernel, compiled by NVRTC when first needed.
//!
//! It does on the GPU exactly the integer arithmetic of the CPU letterbox (OpenCV's
//! fixed-point bilinear, see `peregrine_vision::resample_tables`), from tables built on the
//! host: canvases made on the GPU are the CPU's, bit for bit, given the same decoded pixels.

use std::ffi::{c_char, c_void, CStr, CString};

use super::ffi::Handle;
use super::{api, CudaError, Stream};

const SOURCE: &str = r#"
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

/// The compiled kernel, loaded into the current context.
pub struct LetterboxKernel {
    module: Handle,
    function: Handle,
}

// SAFETY: modules and functions belong to the context, not to a host thread.
unsafe impl Send for LetterboxKernel {}

impl Drop for LetterboxKernel {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: loaded in `compile`, unloaded once.
            unsafe { (api.cu_module_unload)(self.module) };
        }
    }
}

impl LetterboxKernel {
    /// Compiles the kernel for compute capability `major.minor` and loads it into the
    /// calling thread's current context.
    pub fn compile(major: i32, minor: i32) -> Result<Self, CudaError> {
        let api = api()?;
        // SAFETY: cuInit may be called any number of times.
        driver_check("cuInit", unsafe { (api.cu_init)(0) })?;
        let nvrtc = |what: &str, code: i32| {
            if code == 0 {
                Ok(())
            } else {
                Err(CudaError(format!("{what}: NVRTC error {code}")))
            }
        };
        let source = CString::new(SOURCE).expect("no NUL in the source");
        let name = CString::new("letterbox.cu").expect("no NUL");
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
        let compiled =
            unsafe { (api.nvrtc_compile_program)(program, options.len() as i32, options.as_ptr()) };
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
                "compiling the letterbox kernel: NVRTC error {compiled}: {log}"
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
        let ptx = result?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: `ptx` is NUL-terminated PTX text, JIT-compiled by the driver.
        driver_check("cuModuleLoadData", unsafe {
            (api.cu_module_load_data)(&mut module, ptx.as_ptr().cast())
        })?;
        let fname = CString::new("letterbox_bilinear").expect("no NUL");
        let mut function: Handle = std::ptr::null_mut();
        // SAFETY: looks the kernel up in the module just loaded.
        if let Err(e) = driver_check("cuModuleGetFunction", unsafe {
            (api.cu_module_get_function)(&mut function, module, fname.as_ptr())
        }) {
            // SAFETY: unload what was loaded.
            unsafe { (api.cu_module_unload)(module) };
            return Err(e);
        }
        Ok(Self { module, function })
    }

    /// Resamples `src` (RGB rows of `src_pitch` bytes) into the `scaled_w` x `scaled_h`
    /// region at `dst` (rows of `dst_pitch` bytes), with the tables (device memory, four
    /// i32 per column and per row), on `stream`.
    ///
    /// # Safety
    /// Every pointer must be device memory covering what the tables and sizes address.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
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
        let api = api()?;
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
        let (bx, by) = (32u32, 8u32);
        let grid_x = (scaled.0 as u32).div_ceil(bx);
        let grid_y = (scaled.1 as u32).div_ceil(by);
        // SAFETY: the parameters match the kernel's signature and live across the call
        // (the driver copies them at launch).
        driver_check("cuLaunchKernel", unsafe {
            (api.cu_launch_kernel)(
                self.function,
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
}
