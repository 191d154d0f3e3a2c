//! `GET /v1/gb28181/devices`: the GB28181 devices registered with the server's SIP server,
//! their channels (from their catalogs) and which of them are being played.

use axum::extract::{Path, State};
use axum::Json;
use peregrine_gb28181::manscdp::CatalogItem;
use peregrine_gb28181::signalling::DeviceSummary;
use serde_json::{json, Value};

use crate::gauges::write_family;
use crate::{ApiError, AppState};

/// Registered GB28181 devices by state (`online`, `offline`).
pub const DEVICES: &str = "peregrine_gb28181_devices";
/// Channels being played (INVITEd or streaming) over all devices.
pub const PLAYS: &str = "peregrine_gb28181_plays";

fn gb28181_off() -> ApiError {
    ApiError::Missing(
        "GB28181 is off on this server (start it with --gb28181-listen, or [gb28181] in the config file)"
            .into(),
    )
}

/// Every registered device.
pub async fn devices(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let service = state.gb28181.as_ref().ok_or_else(gb28181_off)?;
    let devices: Vec<Value> = service.devices().await.iter().map(device_json).collect();
    Ok(Json(json!({ "devices": devices })))
}

/// One device.
pub async fn device(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let service = state.gb28181.as_ref().ok_or_else(gb28181_off)?;
    let devices = service.devices().await;
    let device = devices
        .iter()
        .find(|d| d.id == id)
        .ok_or_else(|| ApiError::Missing(format!("no GB28181 device {id:?} is registered")))?;
    Ok(Json(device_json(device)))
}

fn device_json(d: &DeviceSummary) -> Value {
    let channels: Vec<Value> = d.channels.iter().map(|c| channel_json(c, d)).collect();
    json!({
        "id": d.id,
        "online": d.online,
        "address": d.address.to_string(),
        "transport": if d.tcp { "tcp" } else { "udp" },
        "user_agent": d.user_agent,
        "registration_expires_in_s": d.expires_in.as_secs(),
        "last_seen_s_ago": d.last_seen_ago.as_secs(),
        "channels": channels,
        "playing": d.playing,
        "stream_url_example": format!("gb28181://{}/{}", d.id, d.channels.first().map_or(d.id.as_str(), |c| c.device_id.as_str())),
    })
}

fn channel_json(c: &CatalogItem, d: &DeviceSummary) -> Value {
    json!({
        "id": c.device_id,
        "name": c.name,
        "manufacturer": c.manufacturer,
        "model": c.model,
        "parent_id": c.parent_id,
        "online": c.online,
        "url": format!("gb28181://{}/{}", d.id, c.device_id),
    })
}

/// Appends the GB28181 gauges to a `/metrics` page.
pub fn write_gauges(out: &mut String, devices: &[DeviceSummary]) {
    let online = devices.iter().filter(|d| d.online).count();
    let samples = [
        ("state=\"online\"".to_string(), online as f64),
        ("state=\"offline\"".to_string(), (devices.len() - online) as f64),
    ];
    write_family(out, DEVICES, Some("Registered GB28181 devices by state"), samples);
    let transports = [("udp", false), ("tcp", true)].map(|(name, tcp)| {
        let n: usize = devices
            .iter()
            .filter(|d| d.tcp == tcp)
            .map(|d| d.playing.len())
            .sum();
        (format!("sip_transport=\"{name}\""), n as f64)
    });
    write_family(
        out,
        PLAYS,
        Some("GB28181 channels being played (invited or streaming), by the device's SIP transport"),
        transports,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn gauges_count_devices_by_state_and_plays() {
        let device = |id: &str, online: bool, playing: &[&str]| DeviceSummary {
            id: id.into(),
            online,
            address: "192.168.1.64:5060".parse().unwrap(),
            tcp: false,
            user_agent: None,
            expires_in: Duration::from_secs(3600),
            last_seen_ago: Duration::ZERO,
            channels: Vec::new(),
            playing: playing.iter().map(|s| s.to_string()).collect(),
        };
        let mut text = String::new();
        let devices = [
            device("a", true, &["c1", "c2"]),
            device("b", false, &[]),
            device("c", true, &["c3"]),
        ];
        write_gauges(&mut text, &devices);
        assert!(
            text.contains("peregrine_gb28181_devices{state=\"online\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("peregrine_gb28181_devices{state=\"offline\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("peregrine_gb28181_plays{sip_transport=\"udp\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("peregrine_gb28181_plays{sip_transport=\"tcp\"} 0\n"),
            "{text}"
        );
    }
}
