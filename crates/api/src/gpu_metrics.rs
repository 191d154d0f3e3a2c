//! GPU telemetry on `/metrics`: each GPU's utilisation, memory and video engine
//! utilisation, read through NVML at every scrape.
//!
//! NVML (`libnvidia-ml.so.1`, installed with the NVIDIA driver) is opened at run time by
//! `nvml-wrapper`, like the rest of CUDA: on a machine without the driver the telemetry is
//! simply absent and no gauge is written. A reading that NVML refuses for one GPU (a field
//! the device does not have, a GPU lost) leaves that gauge out rather than writing a
//! made-up value.

use nvml_wrapper::Nvml;

use crate::gauges::{label_value, write_family};

/// Gauge names, as the dashboards and alert rules use them.
pub const UTILIZATION: &str = "peregrine_gpu_utilization_ratio";
pub const MEMORY_USED: &str = "peregrine_gpu_memory_used_bytes";
pub const MEMORY_TOTAL: &str = "peregrine_gpu_memory_total_bytes";
pub const DECODER_UTILIZATION: &str = "peregrine_gpu_decoder_utilization_ratio";
pub const ENCODER_UTILIZATION: &str = "peregrine_gpu_encoder_utilization_ratio";

/// One GPU's figures at one moment; `None` where NVML gave none.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// NVML's index of the device (the order `nvidia-smi` lists them in).
    pub index: u32,
    pub name: String,
    /// Share of the last sample period in which a kernel ran, 0 to 1.
    pub utilization: Option<f64>,
    pub memory_used: Option<u64>,
    pub memory_total: Option<u64>,
    /// Share of the video decoder (NVDEC) and encoder in use, 0 to 1.
    pub decoder: Option<f64>,
    pub encoder: Option<f64>,
}

/// An open NVML session.
pub struct GpuTelemetry {
    nvml: Nvml,
    devices: u32,
}

impl std::fmt::Debug for GpuTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuTelemetry")
            .field("devices", &self.devices)
            .finish()
    }
}

impl GpuTelemetry {
    /// Opens NVML, or says why there is no GPU telemetry (no driver, no GPU).
    pub fn open() -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
        let devices = nvml
            .device_count()
            .map_err(|e| format!("NVML lists no GPUs: {e}"))?;
        if devices == 0 {
            return Err("NVML lists no GPUs".into());
        }
        Ok(Self { nvml, devices })
    }

    pub fn devices(&self) -> u32 {
        self.devices
    }

    /// Every GPU's figures now. Blocking (a few driver calls per GPU): call it off the
    /// async workers.
    pub fn read(&self) -> Vec<GpuReading> {
        (0..self.devices)
            .filter_map(|index| {
                let device = self.nvml.device_by_index(index).ok()?;
                let memory = device.memory_info().ok();
                let percent = |p: u32| f64::from(p) / 100.0;
                Some(GpuReading {
                    index,
                    name: device.name().unwrap_or_default(),
                    utilization: device.utilization_rates().ok().map(|u| percent(u.gpu)),
                    memory_used: memory.as_ref().map(|m| m.used),
                    memory_total: memory.as_ref().map(|m| m.total),
                    decoder: device.decoder_utilization().ok().map(|u| percent(u.utilization)),
                    encoder: device.encoder_utilization().ok().map(|u| percent(u.utilization)),
                })
            })
            .collect()
    }
}

/// Appends the readings in Prometheus' text format, one family after another, each GPU
/// labelled by `device` (NVML's index) and `name`. Nothing at all without readings.
pub fn write_gpu_gauges(out: &mut String, readings: &[GpuReading]) {
    type Read = fn(&GpuReading) -> Option<f64>;
    let families: [(&str, &str, Read); 5] = [
        (
            UTILIZATION,
            "Share of time a kernel ran on the GPU (NVML), 0 to 1.",
            |r| r.utilization,
        ),
        (MEMORY_USED, "GPU memory in use, all processes (NVML).", |r| {
            r.memory_used.map(|b| b as f64)
        }),
        (MEMORY_TOTAL, "GPU memory in all (NVML).", |r| {
            r.memory_total.map(|b| b as f64)
        }),
        (
            DECODER_UTILIZATION,
            "Share of the GPU's video decoders in use (NVML), 0 to 1.",
            |r| r.decoder,
        ),
        (
            ENCODER_UTILIZATION,
            "Share of the GPU's video encoders in use (NVML), 0 to 1.",
            |r| r.encoder,
        ),
    ];
    for (name, help, read) in families {
        let samples = readings.iter().filter_map(|reading| {
            let labels = format!(
                "device=\"{}\",name=\"{}\"",
                reading.index,
                label_value(&reading.name)
            );
            read(reading).map(|value| (labels, value))
        });
        write_family(out, name, Some(help), samples);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(index: u32) -> GpuReading {
        GpuReading {
            index,
            name: "NVIDIA H200".into(),
            utilization: Some(0.42),
            memory_used: Some(1 << 30),
            memory_total: Some(140 << 30),
            decoder: Some(0.0),
            encoder: None,
        }
    }

    #[test]
    fn each_gpu_is_a_labelled_series_and_missing_fields_are_left_out() {
        let mut out = String::new();
        write_gpu_gauges(&mut out, &[reading(0), reading(1)]);
        assert!(
            out.contains("# TYPE peregrine_gpu_utilization_ratio gauge\n"),
            "{out}"
        );
        assert!(out.contains("peregrine_gpu_utilization_ratio{device=\"0\",name=\"NVIDIA H200\"} 0.42\n"));
        assert!(out.contains("peregrine_gpu_utilization_ratio{device=\"1\",name=\"NVIDIA H200\"} 0.42\n"));
        assert!(
            out.contains("peregrine_gpu_memory_used_bytes{device=\"1\",name=\"NVIDIA H200\"} 1073741824\n")
        );
        assert!(out
            .contains("peregrine_gpu_memory_total_bytes{device=\"0\",name=\"NVIDIA H200\"} 150323855360\n"));
        assert!(out.contains("peregrine_gpu_decoder_utilization_ratio{device=\"0\""));
        // No encoder figure from NVML: no family at all, not a zero.
        assert!(!out.contains(ENCODER_UTILIZATION), "{out}");
        // One TYPE line per family, not per GPU.
        assert_eq!(out.matches("# TYPE peregrine_gpu_utilization_ratio").count(), 1);
    }

    #[test]
    fn no_gpu_writes_nothing() {
        let mut out = String::new();
        write_gpu_gauges(&mut out, &[]);
        assert!(out.is_empty());
    }

    #[test]
    fn label_values_are_escaped() {
        let mut r = reading(0);
        r.name = "odd \"name\"\\".into();
        let mut out = String::new();
        write_gpu_gauges(&mut out, &[r]);
        assert!(out.contains("name=\"odd \\\"name\\\"\\\\\""), "{out}");
    }

    #[test]
    fn opening_without_a_driver_says_why() {
        // On CI there is no NVIDIA driver: an error that names NVML. On a GPU machine,
        // at least one device with a memory total.
        match GpuTelemetry::open() {
            Ok(t) => {
                let readings = t.read();
                assert_eq!(readings.len() as u32, t.devices());
                assert!(readings[0].memory_total.unwrap_or(0) > 0);
            }
            Err(e) => assert!(e.contains("NVML"), "{e}"),
        }
    }
}
