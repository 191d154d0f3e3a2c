//! `GET /v1/gb28181/devices`: the GB28181 devices registered with the server's SIP server,
//! their channels (from their catalogs) and which of them are being played.

use axum::extract::{Path, State};
use axum::Json;
use peregrine_gb28181::manscdp::CatalogItem;
use peregrine_gb28181::signalling::DeviceSummary;
use serde_json::{json, Value};

use crate::{ApiError, AppState};

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
