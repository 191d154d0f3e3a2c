//! Inputs and outputs kept in GPU memory at fixed addresses.
//!
//! By default ONNX Runtime copies each run's host input into device memory it allocates for
//! that run and hands back host outputs it allocated too. Bound here instead: one device
//! input tensor and one device output tensor per session, reused by every run, with the
//! copies in and out made explicitly (cudaMemcpyAsync on a stream of our own) from and into
//! page-locked host memory. Fixed addresses are what a CUDA graph needs (a captured graph
//! replays with the pointers it was captured with), so `--cuda-graph` runs through this, and
//! it is where JPEGs decoded on the GPU and video frames already there are written
//! (`run_with_device_slots`).
//!
//! A session behind this runs one input shape: the device tensors are sized for the first
//! shape seen and a later, different shape replaces them (and, with a CUDA graph, is an
//! error from ONNX Runtime: capture once, one shape).

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{DynTensor, DynTensorValueType, TensorElementType};

use crate::cuda::frames::GpuFrameLetterboxer;
use crate::cuda::jpeg::{ColourConversion, GpuJpegDecoder};
use crate::cuda::{self, CopyKind, Stream};
use crate::ort_backend::read_output;
use crate::staging::{Element, Staging};
use crate::{BackendError, DeviceSlots, InputBuffer, OutputBuffer};

fn fail(what: &'static str) -> impl Fn(ort::Error) -> BackendError {
    move |e| BackendError::Inference(format!("{what}: {e}"))
}

fn cuda_fail(e: cuda::CudaError) -> BackendError {
    BackendError::Inference(e.to_string())
}

/// The run's output, once its shape is known: its pinned host mirror.
struct BoundOutput {
    host: DynTensor,
    bytes: usize,
}

pub(crate) struct DeviceIo {
    device: i32,
    /// Page-locked host memory the engine writes the batch into.
    host_input: Staging,
    element: Element,
    device_alloc: Allocator,
    device_info: MemoryInfo<'static>,
    pinned_output_alloc: Allocator,
    input_name: String,
    output_name: String,
    binding: IoBinding,
    /// The shape the device input was made for, and that input.
    input: Option<([usize; 4], DynTensor)>,
    output: Option<BoundOutput>,
    /// The stream the copies (and JPEG decoding) run on.
    stream: Stream,
    /// Decodes JPEG slots on the device, when asked for.
    jpeg: Option<GpuJpegDecoder>,
    /// Letterboxes video frames already on the device, when asked for.
    frames: Option<GpuFrameLetterboxer>,
}

// SAFETY: every ONNX Runtime and CUDA object here is owned by this value alone and used
// from one thread at a time (`&mut self`); allocators, bindings and streams may move threads.
unsafe impl Send for DeviceIo {}

impl DeviceIo {
    /// With `decode_jpeg` (and its colour conversion), JPEGs can be decoded on the device
    /// straight into the input, and with `frames`, NV12 frames in its memory converted
    /// there (see [`DeviceIo::run_with_device_slots`]).
    pub fn new(
        session: &Session,
        element: Element,
        device: i32,
        decode_jpeg: Option<ColourConversion>,
        frames: bool,
    ) -> Result<Self, BackendError> {
        let err = |e: ort::Error| BackendError::ModelLoad(format!("device-bound inputs and outputs: {e}"));
        let cuda_err =
            |e: cuda::CudaError| BackendError::ModelLoad(format!("device-bound inputs and outputs: {e}"));
        let host_input = Staging::pinned(session, element, device)?;
        let device_info = MemoryInfo::new(
            AllocationDevice::CUDA,
            device,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(err)?;
        let device_alloc = Allocator::new(session, device_info.clone()).map_err(err)?;
        let pinned_out = MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            device,
            AllocatorType::Device,
            MemoryType::CPUOutput,
        )
        .map_err(err)?;
        let pinned_output_alloc = Allocator::new(session, pinned_out).map_err(err)?;
        let input_name = session.inputs()[0].name().to_string();
        let output_name = session.outputs()[0].name().to_string();
        let binding = session.create_binding().map_err(err)?;
        cuda::set_device(device).map_err(cuda_err)?;
        let jpeg = if let Some(conversion) = decode_jpeg {
            if element != Element::U8 {
                return Err(BackendError::ModelLoad(
                    "decoding JPEGs on the GPU needs the rewritten graph (uint8 canvas input)".into(),
                ));
            }
            Some(GpuJpegDecoder::with_conversion(device, conversion).map_err(cuda_err)?)
        } else {
            None
        };
        let frames = if frames {
            if element != Element::U8 {
                return Err(BackendError::ModelLoad(
                    "taking video frames on the GPU needs the rewritten graph (uint8 canvas input)".into(),
                ));
            }
            Some(GpuFrameLetterboxer::new(device).map_err(cuda_err)?)
        } else {
            None
        };
        let stream = cuda::create_stream().map_err(cuda_err)?;
        Ok(Self {
            device,
            host_input,
            element,
            device_alloc,
            device_info: device_info.to_owned(),
            pinned_output_alloc,
            input_name,
            output_name,
            binding,
            input: None,
            output: None,
            stream,
            jpeg,
            frames,
        })
    }

    pub fn decodes_jpeg(&self) -> bool {
        self.jpeg.is_some()
    }

    pub fn frames_device(&self) -> Option<i32> {
        self.frames.as_ref().map(|_| self.device)
    }

    pub fn buffer(&mut self, len: usize) -> Result<InputBuffer<'_>, BackendError> {
        self.host_input.buffer(len)
    }

    /// Copies the written batch to the device, runs `session` on it and copies the first
    /// output back into `output`.
    pub fn run(
        &mut self,
        session: &mut Session,
        shape: [usize; 4],
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        self.run_with_device_slots(session, shape, DeviceSlots::default(), output)
    }

    /// [`DeviceIo::run`], with the slots in `device` written on the device (JPEGs decoded
    /// and letterboxed, frames converted and letterboxed) instead of copied from the host
    /// buffer.
    pub fn run_with_device_slots(
        &mut self,
        session: &mut Session,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        cuda::set_device(self.device).map_err(cuda_fail)?;
        if self.input.as_ref().map(|(s, _)| *s) != Some(shape) {
            let ty = match self.element {
                Element::F32 => TensorElementType::Float32,
                Element::U8 => TensorElementType::Uint8,
            };
            let tensor = DynTensor::new(&self.device_alloc, ty, shape.map(|d| d as i64).to_vec())
                .map_err(fail("allocating the device input"))?;
            self.binding
                .bind_input(self.input_name.as_str(), &tensor)
                .map_err(fail("binding the device input"))?;
            // The output's shape is learnt from the first run at this shape.
            self.binding
                .bind_output_to_device(self.output_name.as_str(), &self.device_info)
                .map_err(fail("binding the output"))?;
            self.output = None;
            self.input = Some((shape, tensor));
        }
        self.upload(shape, device)?;
        let first_output = {
            let mut outputs = {
                let _nvtx = crate::nvtx::range(c"session run");
                session.run_binding(&self.binding)
            }
            .map_err(fail("running the model"))?;
            let value = outputs
                .remove(self.output_name.as_str())
                .ok_or_else(|| BackendError::Output("the run returned no output".into()))?
                .downcast::<DynTensorValueType>()
                .map_err(|e| BackendError::Output(format!("the first output is not a tensor: {e}")))?;
            match &mut self.output {
                Some(bound) => {
                    copy_to_host(&value, &mut bound.host, bound.bytes, &self.stream)?;
                    None
                }
                None => Some(value),
            }
        };
        if let Some(value) = first_output {
            // First run at this shape: make the host mirror, copy into it, and bind a device
            // output of the same shape so every later run writes to one address.
            let element = *value.data_type();
            let dims: Vec<i64> = value.shape().iter().copied().collect();
            let count: usize = dims.iter().map(|&d| d.max(0) as usize).product();
            let bytes = count * element_size(element)?;
            let mut host = DynTensor::new(&self.pinned_output_alloc, element, dims.clone())
                .map_err(fail("allocating the host output"))?;
            copy_to_host(&value, &mut host, bytes, &self.stream)?;
            let device_output = DynTensor::new(&self.device_alloc, element, dims)
                .map_err(fail("allocating the device output"))?;
            self.binding
                .bind_output(self.output_name.as_str(), device_output)
                .map_err(fail("binding the device output"))?;
            self.output = Some(BoundOutput { host, bytes });
        }
        let bound = self.output.as_ref().expect("set above");
        read_output(&bound.host, output)
    }

    /// Writes the device input: host-written slots copied over, JPEG slots decoded there,
    /// frame slots converted there.
    fn upload(&mut self, shape: [usize; 4], device: DeviceSlots<'_>) -> Result<(), BackendError> {
        let n: usize = shape.iter().product();
        if n != self.host_input.len() {
            return Err(BackendError::InputSize {
                shape,
                len: self.host_input.len(),
            });
        }
        let Some((_, device_input)) = self.input.as_mut() else {
            unreachable!("the device input is made before the upload");
        };
        let device_ptr = device_input.data_ptr_mut().cast::<u8>();
        let host_ptr = self
            .host_input
            .pinned_ptr()
            .ok_or_else(|| BackendError::Inference("device inputs need pinned staging".into()))?;
        let slot_bytes = n / shape[0].max(1) * self.element.size();
        // Contiguous runs of host-written slots, one copy each.
        let mut on_device = vec![false; shape[0]];
        let places = device.jpegs.iter().map(|j| j.place.slot);
        for slot in places.chain(device.frames.iter().map(|f| f.place.slot)) {
            *on_device.get_mut(slot).ok_or_else(|| {
                BackendError::Inference(format!("device slot {slot} is outside a batch of {}", shape[0]))
            })? = true;
        }
        let mut slot = 0;
        while slot < shape[0] {
            if on_device[slot] {
                slot += 1;
                continue;
            }
            let start = slot;
            while slot < shape[0] && !on_device[slot] {
                slot += 1;
            }
            // SAFETY: both buffers hold the whole batch; the range is inside it.
            unsafe {
                cuda::copy_async(
                    device_ptr.add(start * slot_bytes).cast(),
                    host_ptr.cast::<u8>().add(start * slot_bytes).cast(),
                    (slot - start) * slot_bytes,
                    CopyKind::HostToDevice,
                    &self.stream,
                )
            }
            .map_err(cuda_fail)?;
        }
        cuda::synchronize(&self.stream).map_err(cuda_fail)?;
        if !device.jpegs.is_empty() {
            let decoder = self
                .jpeg
                .as_mut()
                .ok_or_else(|| BackendError::Inference("this session does not decode JPEGs".into()))?;
            // SAFETY: the device input is [N, H, W, 3] uint8 on this device (checked at
            // construction) and nothing else writes it until the run.
            unsafe { decoder.letterbox_into(device.jpegs, device_ptr, shape[2], shape[1]) }
                .map_err(|e| BackendError::DeviceDecode(e.to_string()))?;
        }
        if !device.frames.is_empty() {
            let letterboxer = self.frames.as_mut().ok_or_else(|| {
                BackendError::Inference("this session does not take frames in GPU memory".into())
            })?;
            // SAFETY: as above for the input; the engine holds each frame (and so its
            // surface) until the batch is answered, and the decoder finished writing it
            // before handing it over.
            unsafe { letterboxer.letterbox_into(device.frames, device_ptr, shape[2], shape[1]) }
                .map_err(|e| BackendError::Inference(format!("letterboxing frames on the GPU: {e}")))?;
        }
        Ok(())
    }
}

fn element_size(element: TensorElementType) -> Result<usize, BackendError> {
    match element {
        TensorElementType::Float32 => Ok(4),
        TensorElementType::Float16 => Ok(2),
        other => Err(BackendError::Output(format!(
            "expected a float32 or float16 output, got {other:?}"
        ))),
    }
}

/// Copies `bytes` of a device output into its pinned host mirror and waits for it.
fn copy_to_host(
    value: &DynTensor,
    host: &mut DynTensor,
    bytes: usize,
    stream: &Stream,
) -> Result<(), BackendError> {
    let _nvtx = crate::nvtx::range(c"output copy");
    // SAFETY: both tensors hold `bytes` (same shape and type); the device one was written by
    // the run, which ONNX Runtime has synchronised before returning.
    unsafe {
        cuda::copy_async(
            host.data_ptr_mut(),
            value.data_ptr(),
            bytes,
            CopyKind::DeviceToHost,
            stream,
        )
    }
    .map_err(cuda_fail)?;
    cuda::synchronize(stream).map_err(cuda_fail)
}
