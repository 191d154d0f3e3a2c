//! Which model instances take work, as plain state: every instance until its device
//! fails. The queue task owns one [`Rotation`]; an instance whose run reports a lost GPU
//! (a sticky CUDA error, see `peregrine_backend::is_sticky_cuda_error`) takes its device's
//! instances out with it, since a corrupt context fails every later call on that device,
//! while instances on other devices keep serving.

use std::collections::BTreeMap;

/// One instance's device and whether it still takes work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstancePlacement {
    /// CUDA's device number, `None` on the CPU.
    pub device: Option<i32>,
    /// Why the instance is out of rotation, once it is.
    pub retired: Option<String>,
}

/// A device newly taken out of rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retirement {
    pub device: Option<i32>,
    /// Its instances, all now out of rotation.
    pub instances: Vec<usize>,
    pub reason: String,
    /// Instances still serving, on other devices.
    pub serving: usize,
}

#[derive(Debug, Clone)]
pub struct Rotation {
    instances: Vec<InstancePlacement>,
}

impl Rotation {
    /// `devices[i]` is instance `i`'s device.
    pub fn new(devices: Vec<Option<i32>>) -> Self {
        Self {
            instances: devices
                .into_iter()
                .map(|device| InstancePlacement {
                    device,
                    retired: None,
                })
                .collect(),
        }
    }

    pub fn in_rotation(&self, instance: usize) -> bool {
        self.instances.get(instance).is_some_and(|p| p.retired.is_none())
    }

    /// Instances still taking work.
    pub fn serving(&self) -> usize {
        self.instances.iter().filter(|p| p.retired.is_none()).count()
    }

    /// Every instance's device and state, by instance number.
    pub fn placement(&self) -> &[InstancePlacement] {
        &self.instances
    }

    /// `instance`'s device failed for `reason`: every instance on that device leaves the
    /// rotation. `None` when the device was already out (its other instances may report
    /// the same failure) or the instance is unknown.
    pub fn device_lost(&mut self, instance: usize, reason: &str) -> Option<Retirement> {
        let placement = self.instances.get(instance)?;
        if placement.retired.is_some() {
            return None;
        }
        let device = placement.device;
        let mut instances = Vec::new();
        for (i, p) in self.instances.iter_mut().enumerate() {
            if p.device == device && p.retired.is_none() {
                p.retired = Some(reason.to_string());
                instances.push(i);
            }
        }
        Some(Retirement {
            device,
            instances,
            reason: reason.to_string(),
            serving: self.serving(),
        })
    }
}

impl InstancePlacement {
    /// `serving`, or `retired` once its device failed: the word status and metrics use.
    pub fn state(&self) -> &'static str {
        if self.retired.is_some() {
            "retired"
        } else {
            "serving"
        }
    }
}

/// Instances (serving, retired) per device, in device order (the CPU first).
pub fn by_device(placement: &[InstancePlacement]) -> BTreeMap<Option<i32>, (usize, usize)> {
    let mut counts = BTreeMap::new();
    for p in placement {
        let (serving, retired) = counts.entry(p.device).or_insert((0, 0));
        if p.retired.is_none() {
            *serving += 1;
        } else {
            *retired += 1;
        }
    }
    counts
}

/// How a device is named in logs, metrics and status: `gpu0`, `gpu1`, ... or `cpu`.
pub fn device_label(device: Option<i32>) -> String {
    device.map_or_else(|| "cpu".to_string(), |d| format!("gpu{d}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two GPUs, two instances each, interleaved as placement spreads them.
    fn two_gpus() -> Rotation {
        Rotation::new(vec![Some(0), Some(1), Some(0), Some(1)])
    }

    #[test]
    fn a_lost_gpu_takes_all_its_instances_and_only_those() {
        let mut r = two_gpus();
        let out = r.device_lost(1, "CUDA failure 700").expect("newly retired");
        assert_eq!(out.device, Some(1));
        assert_eq!(out.instances, vec![1, 3]);
        assert_eq!(out.serving, 2);
        assert!(r.in_rotation(0) && r.in_rotation(2));
        assert!(!r.in_rotation(1) && !r.in_rotation(3));
        assert_eq!(r.placement()[3].retired.as_deref(), Some("CUDA failure 700"));
        assert_eq!(by_device(r.placement())[&Some(1)], (0, 2));
        assert_eq!(by_device(r.placement())[&Some(0)], (2, 0));
        assert_eq!(r.placement()[1].state(), "retired");
        assert_eq!(r.placement()[0].state(), "serving");
    }

    #[test]
    fn the_same_failure_reported_twice_retires_once() {
        let mut r = two_gpus();
        assert!(r.device_lost(3, "first").is_some());
        assert_eq!(
            r.device_lost(1, "second"),
            None,
            "instance 1 left with instance 3"
        );
        assert_eq!(r.placement()[1].retired.as_deref(), Some("first"));
        assert_eq!(r.device_lost(9, "unknown instance"), None);
    }

    #[test]
    fn losing_every_device_leaves_none_serving() {
        let mut r = two_gpus();
        r.device_lost(0, "a");
        let last = r.device_lost(1, "b").expect("newly retired");
        assert_eq!(last.serving, 0);
        assert_eq!(r.serving(), 0);
    }

    #[test]
    fn devices_are_labelled_for_metrics() {
        assert_eq!(device_label(None), "cpu");
        assert_eq!(device_label(Some(3)), "gpu3");
    }
}
