//! The web console: a few static files (HTML, CSS, plain JavaScript, no build step) in
//! `crates/api/console/`, compiled into the binary by `include_bytes!` and served under
//! `/ui` from the API's own port; `/` redirects there. The pages call the public API like
//! any client, with the key the user enters, so the files themselves need none (they hold
//! no data). Nothing is fetched from elsewhere: the Content-Security-Policy allows this
//! origin only.

use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};

use crate::ApiError;

/// One embedded file: its name under `/ui/`, its media type and its bytes.
struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $media_type:expr) => {
        Asset {
            name: $name,
            media_type: $media_type,
            bytes: include_bytes!(concat!("../console/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of `crates/api/console/` (a test checks that none is missing).
static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("api.js", JS),
    asset!("app.js", JS),
    asset!("draw.js", JS),
    asset!("live.js", JS),
    asset!("streams.js", JS),
    asset!("events.js", JS),
    asset!("playground.js", JS),
    asset!("models.js", JS),
    asset!("zones.js", JS),
];

/// This origin only: no CDN, no inline script. Images come as `blob:` URLs, since they are
/// fetched with the key's header.
const CSP: &str = "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; \
                   style-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; \
                   frame-ancestors 'none'";

fn serve(asset: &Asset) -> Response {
    let mut response = (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(asset.media_type)),
            // Revalidated each time: a new binary serves new files at the same names.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        asset.bytes,
    )
        .into_response();
    if asset.media_type.starts_with("text/html") {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    }
    response
}

fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

/// `GET /`: the console.
pub async fn root() -> Redirect {
    Redirect::to("/ui")
}

/// `GET /ui`: the console's page; its sections are `#/live`, `#/streams`, ... in the URL's
/// fragment, so one document serves them all.
pub async fn index() -> Response {
    find("index.html").map_or_else(|| ApiError::NotFound.into_response(), serve)
}

/// `GET /ui/{file}`: a script, the style sheet or an icon.
pub async fn asset(Path(name): Path<String>) -> Response {
    find(&name).map_or_else(|| ApiError::NotFound.into_response(), serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_console_directory_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("crates/api/console exists")
            .map(|e| {
                e.expect("a readable entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.name.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }

    #[test]
    fn the_page_names_only_embedded_scripts_and_styles() {
        let page = std::str::from_utf8(find("index.html").unwrap().bytes).unwrap();
        for (at, _) in page.match_indices("/ui/") {
            let name: String = page[at + 4..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
                .collect();
            assert!(
                find(&name).is_some(),
                "index.html names /ui/{name}, which is not embedded"
            );
        }
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no other origin"
        );
    }

    #[tokio::test]
    async fn unknown_files_are_404_and_html_carries_the_policy() {
        let missing = asset(Path("nope.js".into())).await;
        assert_eq!(missing.status(), axum::http::StatusCode::NOT_FOUND);
        let page = index().await;
        assert!(page.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("default-src 'self'"));
        let script = asset(Path("app.js".into())).await;
        assert_eq!(script.headers()[header::CONTENT_TYPE], JS);
    }
}
