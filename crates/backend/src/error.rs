use std::path::PathBuf;

use crate::runtime::ORT_VERSION;

/// Everything that can go wrong between a model file and its output.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "ONNX Runtime {ORT_VERSION} was not found (looked in: {}). Run `make setup` in the \
         Peregrine checkout to fetch it, or set ORT_DYLIB_PATH to a libonnxruntime.so of \
         version {ORT_VERSION} or newer",
        .searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    RuntimeNotFound { searched: Vec<PathBuf> },
    #[error(
        "could not load ONNX Runtime from {path}: {reason}. Peregrine needs ONNX Runtime \
         {ORT_VERSION} or newer: run `make setup`, or point ORT_DYLIB_PATH at a suitable \
         libonnxruntime.so"
    )]
    RuntimeLoad { path: PathBuf, reason: String },
    #[error("could not load the model: {0}")]
    ModelLoad(String),
    #[error("execution provider {provider} is not available: {reason}")]
    ProviderUnavailable { provider: String, reason: String },
    #[error("input batch has shape {shape:?} but {len} values")]
    InputSize { shape: [usize; 4], len: usize },
    #[error("inference failed: {0}")]
    Inference(String),
    /// Decoding JPEGs on the device failed for the batch; its images may be decoded on the
    /// host instead (one bad file fails the whole device call, so which one is unknown).
    #[error("decoding JPEGs on the GPU failed: {0}")]
    DeviceDecode(String),
    #[error("the model's output is unusable: {0}")]
    Output(String),
    /// The GPU's context is unusable: CUDA reported an error that stays with the context
    /// (an illegal address, a failed launch, an uncorrectable ECC error), so every later
    /// call on this device fails too. The instance cannot recover; the device's other
    /// instances are no better off.
    #[error("GPU {device} failed and cannot run anything more in this process: {reason}")]
    DeviceLost { device: i32, reason: String },
}

/// CUDA errors after which the context is corrupt and every later call on it fails, as
/// CUDA's runtime API documents them ("the process is left in an inconsistent state"):
/// the code, the enum's name and the text `cudaGetErrorString` gives. ONNX Runtime's
/// messages read "CUDA failure 700: an illegal memory access was encountered ; GPU=0 ...".
const STICKY_CUDA_ERRORS: &[(u32, &str, &str)] = &[
    (214, "cudaErrorECCUncorrectable", "uncorrectable ecc error"),
    (
        700,
        "cudaErrorIllegalAddress",
        "an illegal memory access was encountered",
    ),
    (
        702,
        "cudaErrorLaunchTimeout",
        "the launch timed out and was terminated",
    ),
    (709, "cudaErrorContextIsDestroyed", "context is destroyed"),
    (710, "cudaErrorAssert", "device-side assert triggered"),
    (714, "cudaErrorHardwareStackError", "hardware stack error"),
    (
        715,
        "cudaErrorIllegalInstruction",
        "an illegal instruction was encountered",
    ),
    (716, "cudaErrorMisalignedAddress", "misaligned address"),
    (
        717,
        "cudaErrorInvalidAddressSpace",
        "operation not supported on global/shared address space",
    ),
    (718, "cudaErrorInvalidPc", "invalid program counter"),
    (719, "cudaErrorLaunchFailure", "unspecified launch failure"),
];

/// Whether an error message reports a CUDA error that leaves the device's context unusable
/// (see [`STICKY_CUDA_ERRORS`]). Out of memory, a bad input shape or a cuDNN status are
/// not: the next run may well succeed.
pub fn is_sticky_cuda_error(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    STICKY_CUDA_ERRORS.iter().any(|(code, name, text)| {
        lower.contains(text)
            || lower.contains(&name.to_ascii_lowercase())
            || lower.contains(&format!("cuda failure {code}:"))
            || lower.contains(&format!("cuda error {code}:"))
    })
}

impl BackendError {
    /// This error as seen from a run on `device`: a sticky CUDA error there becomes
    /// [`BackendError::DeviceLost`]; anything else, or a run on the CPU, is unchanged.
    pub fn on_device(self, device: Option<i32>) -> Self {
        let Some(device) = device else { return self };
        match self {
            Self::Inference(reason) | Self::DeviceDecode(reason) | Self::Output(reason)
                if is_sticky_cuda_error(&reason) =>
            {
                Self::DeviceLost { device, reason }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_cuda_errors_are_told_from_passing_ones() {
        let sticky = [
            "CUDA failure 700: an illegal memory access was encountered ; GPU=1 ; hostname=h ; file=x.cc ; line=1 ; expr=cudaStreamSynchronize(s);",
            "cudaMemcpyAsync: cudaErrorLaunchFailure (unspecified launch failure)",
            "CUDA error 719: unspecified launch failure",
            "Non-zero status code returned while running Conv node. Status Message: CUDA failure 710: device-side assert triggered",
            "uncorrectable ECC error encountered",
        ];
        let passing = [
            "CUDA failure 2: out of memory ; GPU=0",
            "Failed to allocate memory for requested buffer of size 123456",
            "CUDNN failure 9: CUDNN_STATUS_NOT_SUPPORTED",
            "Got invalid dimensions for input: images for the following indices",
            "CUDA failure 7000: made up",
        ];
        for m in sticky {
            assert!(is_sticky_cuda_error(m), "{m}");
        }
        for m in passing {
            assert!(!is_sticky_cuda_error(m), "{m}");
        }
    }

    #[test]
    fn only_a_gpu_run_loses_its_device() {
        let e =
            || BackendError::Inference("CUDA failure 700: an illegal memory access was encountered".into());
        assert!(matches!(
            e().on_device(Some(1)),
            BackendError::DeviceLost { device: 1, .. }
        ));
        assert!(matches!(e().on_device(None), BackendError::Inference(_)));
        let oom = BackendError::Inference("CUDA failure 2: out of memory".into());
        assert!(matches!(oom.on_device(Some(0)), BackendError::Inference(_)));
    }
}
