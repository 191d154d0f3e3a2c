//! The few CUDA driver calls NVDEC decoding makes itself, resolved from `libcuda` at run
//! time (as FFmpeg does), so that a machine without the driver builds and runs: the GPU's
//! primary context, a stream per decoder, page-locked host memory and blocking events.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;

pub(super) type Context = *mut c_void;
pub(super) type Stream = *mut c_void;
pub(super) type Event = *mut c_void;

const SUCCESS: c_int = 0;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream,
/// which every decoder of the context would otherwise queue behind.
pub(super) const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: a thread waiting on the event
/// sleeps instead of spinning a core, whatever scheduling flags the context has.
pub(super) const EVENT_BLOCKING_NO_TIMING: c_uint = 0x1 | 0x2;
const MEMORY_TYPE_HOST: c_uint = 1;
const MEMORY_TYPE_DEVICE: c_uint = 2;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Memcpy2d {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: c_uint,
    src_host: *const c_void,
    src_device: u64,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: c_uint,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

/// One plane's rows, from a device pointer to host memory.
pub(super) struct PlaneCopy {
    pub src: u64,
    pub src_pitch: usize,
    pub dst: *mut u8,
    pub dst_pitch: usize,
    pub row_bytes: usize,
    pub rows: usize,
}

pub(super) struct Driver {
    _lib: Library,
    get_error_string: unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int,
    init: unsafe extern "C" fn(c_uint) -> c_int,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    primary_ctx_retain: unsafe extern "C" fn(*mut Context, c_int) -> c_int,
    ctx_push: unsafe extern "C" fn(Context) -> c_int,
    ctx_pop: unsafe extern "C" fn(*mut Context) -> c_int,
    stream_create: unsafe extern "C" fn(*mut Stream, c_uint) -> c_int,
    stream_destroy: unsafe extern "C" fn(Stream) -> c_int,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> c_int,
    memcpy_2d_async: unsafe extern "C" fn(*const Memcpy2d, Stream) -> c_int,
    event_create: unsafe extern "C" fn(*mut Event, c_uint) -> c_int,
    event_record: unsafe extern "C" fn(Event, Stream) -> c_int,
    event_synchronize: unsafe extern "C" fn(Event) -> c_int,
    event_destroy: unsafe extern "C" fn(Event) -> c_int,
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The driver, loaded and initialised on first use; the failure is kept (a missing
/// driver does not appear later).
pub(super) fn driver() -> Result<&'static Driver, String> {
    DRIVER.get_or_init(Driver::load).as_ref().map_err(Clone::clone)
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's type is the one cuda.h declares for it.
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("the CUDA driver has no {}: {e}", $name))?
    };
}

impl Driver {
    fn load() -> Result<Self, String> {
        // SAFETY: loading the driver runs its initialisers, which is what it is for.
        let lib = unsafe { Library::new("libcuda.so.1") }
            .map_err(|e| format!("the NVIDIA driver's libcuda.so.1 did not load: {e}"))?;
        let driver = Self {
            get_error_string: sym!(lib, "cuGetErrorString"),
            init: sym!(lib, "cuInit"),
            device_get: sym!(lib, "cuDeviceGet"),
            primary_ctx_retain: sym!(lib, "cuDevicePrimaryCtxRetain"),
            ctx_push: sym!(lib, "cuCtxPushCurrent_v2"),
            ctx_pop: sym!(lib, "cuCtxPopCurrent_v2"),
            stream_create: sym!(lib, "cuStreamCreate"),
            stream_destroy: sym!(lib, "cuStreamDestroy_v2"),
            mem_host_alloc: sym!(lib, "cuMemHostAlloc"),
            mem_free_host: sym!(lib, "cuMemFreeHost"),
            memcpy_2d_async: sym!(lib, "cuMemcpy2DAsync_v2"),
            event_create: sym!(lib, "cuEventCreate"),
            event_record: sym!(lib, "cuEventRecord"),
            event_synchronize: sym!(lib, "cuEventSynchronize"),
            event_destroy: sym!(lib, "cuEventDestroy_v2"),
            _lib: lib,
        };
        // SAFETY: cuInit takes flags that must be 0.
        driver.check(unsafe { (driver.init)(0) }, "cuInit")?;
        Ok(driver)
    }

    fn check(&self, rc: c_int, what: &str) -> Result<(), String> {
        if rc == SUCCESS {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString sets a static string or leaves the pointer null.
        let text = unsafe {
            (self.get_error_string)(rc, &mut text);
            if text.is_null() {
                format!("CUDA error {rc}")
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        Err(format!("{what}: {text}"))
    }

    /// GPU `ordinal`'s primary context, retained for the process's life: the context ONNX
    /// Runtime's CUDA provider uses, whatever scheduling flags it was started with.
    pub(super) fn retain_primary_context(&self, ordinal: i32) -> Result<Context, String> {
        let mut device = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-pointers to locals.
        unsafe {
            self.check((self.device_get)(&mut device, ordinal), "cuDeviceGet")?;
            self.check(
                (self.primary_ctx_retain)(&mut ctx, device),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        Ok(ctx)
    }

    /// Runs `f` with `ctx` current on this thread.
    pub(super) fn with_context<T>(
        &self,
        ctx: Context,
        f: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        // SAFETY: `ctx` is a retained context; the push is undone before returning.
        self.check(unsafe { (self.ctx_push)(ctx) }, "cuCtxPushCurrent")?;
        let result = f();
        let mut popped = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        unsafe { (self.ctx_pop)(&mut popped) };
        result
    }

    /// A non-blocking stream in the current context.
    pub(super) fn create_stream(&self) -> Result<Stream, String> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.check(
            unsafe { (self.stream_create)(&mut stream, STREAM_NON_BLOCKING) },
            "cuStreamCreate",
        )?;
        Ok(stream)
    }

    /// Destroys `stream`, making `ctx` current for it.
    ///
    /// # Safety
    /// `stream` was made by [`Self::create_stream`] in `ctx` and is not used again.
    pub(super) unsafe fn destroy_stream(&self, ctx: Context, stream: Stream) -> Result<(), String> {
        self.with_context(ctx, || {
            (self.stream_destroy)(stream);
            Ok(())
        })
    }

    /// Page-locked host memory (the GPU copies into it at full speed, without staging).
    pub(super) fn host_alloc(&self, bytes: usize) -> Result<*mut u8, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; flags 0 is plain page-locked memory.
        self.check(
            unsafe { (self.mem_host_alloc)(&mut p, bytes, 0) },
            "cuMemHostAlloc",
        )?;
        Ok(p.cast())
    }

    /// # Safety
    /// `p` came from [`Self::host_alloc`] and is not used again.
    pub(super) unsafe fn host_free(&self, p: *mut u8) {
        (self.mem_free_host)(p.cast());
    }

    /// A blocking, untimed event in the current context.
    pub(super) fn create_event(&self) -> Result<Event, String> {
        let mut event = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.check(
            unsafe { (self.event_create)(&mut event, EVENT_BLOCKING_NO_TIMING) },
            "cuEventCreate",
        )?;
        Ok(event)
    }

    /// # Safety
    /// `event` came from [`Self::create_event`] and is not used again.
    pub(super) unsafe fn destroy_event(&self, event: Event) {
        (self.event_destroy)(event);
    }

    /// Queues `plane`'s copy from device memory to host memory on `stream`.
    ///
    /// # Safety
    /// Both regions hold `plane.rows` rows at their pitches; the host region stays valid
    /// until the stream has run the copy.
    pub(super) unsafe fn copy_to_host(&self, plane: &PlaneCopy, stream: Stream) -> Result<(), String> {
        let copy = Memcpy2d {
            src_x_in_bytes: 0,
            src_y: 0,
            src_memory_type: MEMORY_TYPE_DEVICE,
            src_host: std::ptr::null(),
            src_device: plane.src,
            src_array: std::ptr::null_mut(),
            src_pitch: plane.src_pitch,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_memory_type: MEMORY_TYPE_HOST,
            dst_host: plane.dst.cast(),
            dst_device: 0,
            dst_array: std::ptr::null_mut(),
            dst_pitch: plane.dst_pitch,
            width_in_bytes: plane.row_bytes,
            height: plane.rows,
        };
        self.check((self.memcpy_2d_async)(&copy, stream), "cuMemcpy2DAsync")
    }

    /// Waits, sleeping, until everything queued on `stream` so far has run.
    ///
    /// # Safety
    /// `event` and `stream` belong to the current context.
    pub(super) unsafe fn wait_for(&self, event: Event, stream: Stream) -> Result<(), String> {
        self.check((self.event_record)(event, stream), "cuEventRecord")?;
        self.check((self.event_synchronize)(event), "cuEventSynchronize")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_copy_descriptor_has_cudas_layout() {
        // cuda.h's CUDA_MEMCPY2D on 64-bit Linux: 16 fields, 128 bytes.
        assert_eq!(std::mem::size_of::<super::Memcpy2d>(), 128);
        assert_eq!(std::mem::offset_of!(super::Memcpy2d, src_device), 32);
        assert_eq!(std::mem::offset_of!(super::Memcpy2d, dst_memory_type), 72);
        assert_eq!(std::mem::offset_of!(super::Memcpy2d, width_in_bytes), 112);
    }
}
