//! Video frames already in GPU memory: handed to the engine as they are and letterboxed by
//! the instance that runs their batch (`--gpu-frames`).

use std::time::{Duration, Instant};

use peregrine_types::DetectParams;
use peregrine_vision::yuv::Nv12Image;
use peregrine_vision::Letterbox;

use super::{AdmissionPermit, Engine};
use crate::admission::Stage;
use crate::request::{ImageResult, RequestError};
use crate::slot::{FrameOwner, Slot};

impl Engine {
    /// The GPU whose video frames [`Engine::detect_device_frame`] takes, if any: every
    /// instance runs there and converts and letterboxes frames in its memory.
    pub fn frames_device(&self) -> Option<i32> {
        self.shared.frames_device
    }

    /// Detects objects in a video frame that is in GPU memory (an NV12 surface), converted
    /// and letterboxed on the GPU by the instance that runs it, batched with every other
    /// request. `owner` keeps the frame's memory alive and unchanged; it is released once
    /// the batch is answered. Refused with [`RequestError::FrameNotTaken`] when the frame is
    /// not on [`Engine::frames_device`] (the caller then converts it on the host).
    pub async fn detect_device_frame(
        &self,
        _permit: &AdmissionPermit,
        image: Nv12Image,
        owner: FrameOwner,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        let started = Instant::now();
        let outcome = self.submit_device_frame(image, owner, params, deadline).await;
        self.finish(started, &outcome);
        outcome
    }

    async fn submit_device_frame(
        &self,
        image: Nv12Image,
        owner: FrameOwner,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        if self.shared.frames_device != Some(image.device) {
            return Err(RequestError::FrameNotTaken(format!(
                "the frame is in GPU {}'s memory and model {} {}",
                image.device,
                self.shared.config.name,
                match self.shared.frames_device {
                    Some(d) => format!("takes frames on GPU {d} only"),
                    None => "takes no frames in GPU memory".into(),
                }
            )));
        }
        image.check().map_err(RequestError::FrameNotTaken)?;
        self.check_admissible(deadline, false, Stage::BeforeDecode)?;
        let spec = &self.shared.spec;
        let (width, height) = (image.width, image.height);
        let letterbox = Letterbox::new(width, height, spec.input_width, spec.input_height);
        let slot = Slot::Frame {
            image,
            owner,
            letterbox,
            params,
        };
        self.submit_image(slot, deadline, Duration::ZERO, (width as u32, height as u32))
            .await
    }
}
