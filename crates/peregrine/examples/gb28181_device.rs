//! Simulated GB28181 devices for measurements (scripts/gb28181-cost.sh): `DEVICES` devices,
//! each with one channel, register with a Peregrine server's SIP port and push an mp4 clip
//! (muxed into PS by GStreamer's mpegpsmux) as PS over RTP wherever they are invited, the
//! clip `ROUNDS` times. The same device the integration test uses
//! (crates/peregrine/tests/gb28181/device.rs).
//!
//!   gb28181_device SIP_ADDRESS PASSWORD CLIP DEVICES ROUNDS
//!
//! Device ids are 340200000013200000NN, channels 340200000013100000NN (NN from 01); it
//! prints "REGISTERED <n>" once all are registered and runs until killed.

#[allow(dead_code)]
#[path = "../tests/gb28181/device.rs"]
mod device;
#[allow(dead_code)]
#[path = "../../video/tests/support/rtp_pusher.rs"]
mod rtp_pusher;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use peregrine_gb28181::simulated::DeviceIdentity;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [sip, password, clip, devices, rounds] = &args[..] else {
        eprintln!("usage: gb28181_device SIP_ADDRESS PASSWORD CLIP DEVICES ROUNDS");
        std::process::exit(2);
    };
    let sip = sip.parse().expect("SIP_ADDRESS is host:port");
    let devices: u32 = devices.parse().expect("DEVICES is a number");
    let dir = std::env::temp_dir().join(format!("gb28181-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ps = std::fs::read(rtp_pusher::mux_ps(clip.as_ref(), &dir)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let media = device::Media {
        frames: Arc::new(rtp_pusher::ps_frames(&ps)),
        impairment: rtp_pusher::Impairment {
            swap_every: 0,
            drop: &[],
        },
        lockstep: 1,
        rounds: rounds.parse().expect("ROUNDS is a number"),
        // Sender reports every second, as many cameras send them, on a clock in step.
        clock_behind: Some(Duration::ZERO),
    };
    let mut states = Vec::new();
    for n in 1..=devices {
        let identity = DeviceIdentity {
            id: format!("340200000013200000{n:02}"),
            channels: vec![format!("340200000013100000{n:02}")],
            domain: "3402000000".into(),
            server_id: "34020000002000000001".into(),
            password: password.clone(),
            address: String::new(),
            tcp: false,
            media_port: 0,
        };
        states.push(device::start(identity, sip, media.clone()).await);
    }
    while states.iter().any(|s| s.registered.load(Ordering::Relaxed) == 0) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("REGISTERED {devices}");
    std::future::pending::<()>().await;
}
