//! Which decoder a stream uses: the choice a stream or the server asks for, the plan made
//! from it and what the machine offers, and what actually decoded (the stream's status).
//! Pure: the FFmpeg side is in [`super::nvdec`].

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;

/// `decoder = "auto" | "cpu" | "nvdec"` (a stream's, or the server's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DecoderKind {
    /// NVDEC when the models run on a GPU (the CUDA or TensorRT provider) and NVDEC takes
    /// the stream's codec and profile; the CPU otherwise, with the reason in the status.
    #[default]
    Auto,
    /// FFmpeg's software decoders on the CPU cores.
    Cpu,
    /// NVDEC or nothing: a stream NVDEC cannot decode is not decoded, and says why.
    Nvdec,
}

impl DecoderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Nvdec => "nvdec",
        }
    }
}

impl FromStr for DecoderKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "nvdec" => Ok(Self::Nvdec),
            other => Err(format!("unknown decoder {other:?}: expected auto, cpu or nvdec")),
        }
    }
}

impl std::fmt::Display for DecoderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What decodes a stream's pictures now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveDecoder {
    Cpu,
    Nvdec,
}

impl ActiveDecoder {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Nvdec => "nvdec",
        }
    }
}

/// How a stream's decoder is to be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodePlan {
    /// On the CPU; `reason` says why when NVDEC was possible in principle (`auto`).
    Cpu { reason: Option<String> },
    /// On GPU `device`'s NVDEC; `required` (`nvdec`) refuses the CPU as a fallback.
    Nvdec { device: i32, required: bool },
}

/// The server's side of the choice: its default and the GPUs its models run on, if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecoderDefaults {
    /// What streams that do not say get.
    pub kind: DecoderKind,
    /// The GPUs the models run on (empty: the CPU provider).
    pub model_gpus: Vec<i32>,
    /// The models take frames in GPU memory (`--gpu-frames`): NVDEC's pictures stay there.
    pub gpu_frames: bool,
}

impl DecoderDefaults {
    /// The plan for a stream that asked for decoder `requested` and GPU `gpu` (or
    /// nothing), while `nvdec_streams` says how many streams each GPU's NVDEC decodes
    /// already: a stream that names no GPU goes to the models' GPU with the fewest (the
    /// first listed among equals).
    pub fn plan(
        &self,
        requested: Option<DecoderKind>,
        gpu: Option<i32>,
        nvdec_streams: &BTreeMap<i32, usize>,
    ) -> DecodePlan {
        let least_loaded = || {
            self.model_gpus
                .iter()
                .copied()
                .min_by_key(|g| nvdec_streams.get(g).copied().unwrap_or(0))
        };
        match (requested.unwrap_or(self.kind), gpu.or_else(least_loaded)) {
            (DecoderKind::Cpu, _) => DecodePlan::Cpu { reason: None },
            (DecoderKind::Auto, None) => DecodePlan::Cpu {
                reason: Some("the models run on the CPU provider".into()),
            },
            (DecoderKind::Auto, Some(device)) => DecodePlan::Nvdec {
                device,
                required: false,
            },
            // Asked for by name: decode on the chosen GPU, or GPU 0 when the models run on
            // the CPU.
            (DecoderKind::Nvdec, gpu) => DecodePlan::Nvdec {
                device: gpu.unwrap_or(0),
                required: true,
            },
        }
    }
}

impl DecoderDefaults {
    /// Whether a stream decoding on `plan` leaves its pictures in GPU memory: only with
    /// `gpu_frames`, on NVDEC, and on a GPU the models run on (a frame on another GPU would
    /// be copied down again for them).
    pub fn keeps_frames_on_gpu(&self, plan: &DecodePlan) -> bool {
        match plan {
            DecodePlan::Nvdec { device, .. } => self.gpu_frames && self.model_gpus.contains(device),
            DecodePlan::Cpu { .. } => false,
        }
    }
}

/// What a stream's status says about its decoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderStatus {
    pub requested: DecoderKind,
    /// The GPU whose NVDEC the plan chose, if it chose NVDEC.
    pub gpu: Option<i32>,
    /// `None` until the first decoder has been opened (and, for NVDEC, has seen the
    /// stream's format), or while a required NVDEC cannot decode the stream.
    pub active: Option<ActiveDecoder>,
    /// Why the stream is not on NVDEC (a fallback or the reason `nvdec` fails); `None` when
    /// it is, or the CPU was asked for.
    pub reason: Option<String>,
}

/// One stream's [`DecoderStatus`], written by its decode thread, read by status requests.
#[derive(Debug, Clone)]
pub struct DecoderStatusCell(Arc<Mutex<DecoderStatus>>);

impl DecoderStatusCell {
    pub fn new(requested: DecoderKind, gpu: Option<i32>) -> Self {
        Self(Arc::new(Mutex::new(DecoderStatus {
            requested,
            gpu,
            active: None,
            reason: None,
        })))
    }

    pub fn get(&self) -> DecoderStatus {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records what decodes now; true when it changed (so the caller logs it once).
    pub fn set(&self, active: Option<ActiveDecoder>, reason: Option<String>) -> bool {
        let mut status = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = status.active != active || status.reason != reason;
        status.active = active;
        status.reason = reason;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(kind: DecoderKind, model_gpu: Option<i32>) -> DecoderDefaults {
        DecoderDefaults {
            kind,
            model_gpus: model_gpu.into_iter().collect(),
            gpu_frames: false,
        }
    }

    #[test]
    fn frames_stay_on_the_gpu_only_when_asked_on_nvdec_and_on_a_models_gpu() {
        let mut defaults = DecoderDefaults {
            kind: DecoderKind::Auto,
            model_gpus: vec![1],
            gpu_frames: true,
        };
        let on = |device| DecodePlan::Nvdec {
            device,
            required: false,
        };
        assert!(defaults.keeps_frames_on_gpu(&on(1)));
        assert!(
            !defaults.keeps_frames_on_gpu(&on(0)),
            "not a GPU the models run on"
        );
        assert!(!defaults.keeps_frames_on_gpu(&DecodePlan::Cpu { reason: None }));
        defaults.gpu_frames = false;
        assert!(!defaults.keeps_frames_on_gpu(&on(1)));
    }

    impl DecoderDefaults {
        /// The plan for a stream naming no GPU, with no other stream running.
        fn plan_alone(&self, requested: Option<DecoderKind>) -> DecodePlan {
            self.plan(requested, None, &BTreeMap::new())
        }
    }

    #[test]
    fn streams_go_to_the_gpu_with_the_fewest_unless_they_name_one() {
        let two = DecoderDefaults {
            kind: DecoderKind::Auto,
            model_gpus: vec![0, 1],
            gpu_frames: false,
        };
        let nvdec = |device| DecodePlan::Nvdec {
            device,
            required: false,
        };
        assert_eq!(
            two.plan(None, None, &BTreeMap::new()),
            nvdec(0),
            "the first among equals"
        );
        assert_eq!(two.plan(None, None, &BTreeMap::from([(0, 1)])), nvdec(1));
        assert_eq!(two.plan(None, None, &BTreeMap::from([(0, 2), (1, 2)])), nvdec(0));
        assert_eq!(
            two.plan(None, Some(0), &BTreeMap::from([(0, 5)])),
            nvdec(0),
            "named"
        );
        assert_eq!(
            two.plan(Some(DecoderKind::Cpu), Some(1), &BTreeMap::new()),
            DecodePlan::Cpu { reason: None }
        );
    }

    #[test]
    fn auto_decodes_on_the_models_gpu_and_on_the_cpu_without_one() {
        assert_eq!(
            on(DecoderKind::Auto, Some(1)).plan_alone(None),
            DecodePlan::Nvdec {
                device: 1,
                required: false
            }
        );
        let DecodePlan::Cpu { reason: Some(reason) } = on(DecoderKind::Auto, None).plan_alone(None) else {
            panic!("auto without a GPU must be the CPU, with a reason");
        };
        assert!(reason.contains("CPU provider"), "{reason}");
    }

    #[test]
    fn a_streams_own_choice_beats_the_servers_default() {
        let server = on(DecoderKind::Nvdec, Some(0));
        assert_eq!(
            server.plan_alone(Some(DecoderKind::Cpu)),
            DecodePlan::Cpu { reason: None }
        );
        assert_eq!(
            on(DecoderKind::Cpu, None).plan_alone(Some(DecoderKind::Nvdec)),
            DecodePlan::Nvdec {
                device: 0,
                required: true
            }
        );
        assert_eq!(
            on(DecoderKind::Cpu, Some(3)).plan_alone(Some(DecoderKind::Auto)),
            DecodePlan::Nvdec {
                device: 3,
                required: false
            }
        );
    }

    #[test]
    fn kinds_parse_from_their_names_and_refuse_others_by_name() {
        for kind in [DecoderKind::Auto, DecoderKind::Cpu, DecoderKind::Nvdec] {
            assert_eq!(kind.as_str().parse::<DecoderKind>(), Ok(kind));
        }
        let err = "cuvid".parse::<DecoderKind>().unwrap_err();
        assert!(
            err.contains("cuvid") && err.contains("auto, cpu or nvdec"),
            "{err}"
        );
        #[derive(Deserialize)]
        struct S {
            decoder: DecoderKind,
        }
        let s: S = toml::from_str("decoder = \"nvdec\"").unwrap();
        assert_eq!(s.decoder, DecoderKind::Nvdec);
        assert!(toml::from_str::<S>("decoder = \"gpu\"").is_err());
    }

    #[test]
    fn the_status_cell_reports_changes_once() {
        let cell = DecoderStatusCell::new(DecoderKind::Auto, Some(0));
        assert_eq!(cell.get().active, None);
        assert!(cell.set(Some(ActiveDecoder::Nvdec), None));
        assert!(!cell.set(Some(ActiveDecoder::Nvdec), None));
        assert!(cell.set(Some(ActiveDecoder::Cpu), Some("no GPU".into())));
        let status = cell.get();
        assert_eq!(status.requested, DecoderKind::Auto);
        assert_eq!(status.active, Some(ActiveDecoder::Cpu));
        assert_eq!(status.reason.as_deref(), Some("no GPU"));
    }
}
