//! FFmpeg's own log lines, routed into `tracing` (target `ffmpeg`).
//!
//! Left alone, FFmpeg writes straight to standard error in pieces, from every decoder thread at
//! once, at its INFO level: lines interleave with the server's log, bypass `--log-level` and the
//! JSON format, and may carry bytes that are not UTF-8 (a log reader that decodes text then
//! fails). Here each line is formatted by FFmpeg itself (`av_log_format_line2`, so the
//! `[h264 @ 0x..]` prefix stays), made valid UTF-8 and logged as one event.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Once;

use ffmpeg_sys_next as ff;

/// FFmpeg's level mapped to ours: errors in one picture are a camera's trouble rather than the
/// server's, so they are warnings; FFmpeg's warnings (missing references after a cut and the
/// like) are debug lines, its informational lines trace ones, and its verbose and debug output
/// is never formatted at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mapped {
    Warn,
    Debug,
    Trace,
    Drop,
}

fn map_level(level: c_int) -> Mapped {
    match level {
        l if l <= ff::AV_LOG_ERROR => Mapped::Warn,
        l if l <= ff::AV_LOG_WARNING => Mapped::Debug,
        l if l <= ff::AV_LOG_INFO => Mapped::Trace,
        _ => Mapped::Drop,
    }
}

/// A formatted line as text: lossy UTF-8, trailing line breaks cut, empty lines dropped.
fn line_text(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = String::from_utf8_lossy(&bytes[..end]);
    let text = text.trim_end_matches(['\n', '\r']);
    (!text.trim().is_empty()).then(|| text.to_string())
}

thread_local! {
    // FFmpeg's "does the next piece start a line" state, per thread as the pieces are.
    static PRINT_PREFIX: Cell<c_int> = const { Cell::new(1) };
}

unsafe extern "C" fn log_line(
    avcl: *mut c_void,
    level: c_int,
    fmt: *const c_char,
    args: *mut ff::__va_list_tag,
) {
    let mapped = map_level(level);
    if mapped == Mapped::Drop {
        return;
    }
    let mut buf = [0u8; 1024];
    let mut prefix = PRINT_PREFIX.with(Cell::get);
    // SAFETY: the arguments are FFmpeg's own, passed through unchanged and used once; the
    // buffer's length is given, and FFmpeg always terminates what it writes.
    unsafe {
        ff::av_log_format_line2(
            avcl,
            level,
            fmt,
            args,
            buf.as_mut_ptr().cast::<c_char>(),
            buf.len() as c_int,
            &mut prefix,
        );
    }
    PRINT_PREFIX.with(|p| p.set(prefix));
    let Some(text) = line_text(&buf) else { return };
    match mapped {
        Mapped::Warn => tracing::warn!(target: "ffmpeg", "{text}"),
        Mapped::Debug => tracing::debug!(target: "ffmpeg", "{text}"),
        Mapped::Trace => tracing::trace!(target: "ffmpeg", "{text}"),
        Mapped::Drop => {}
    }
}

/// Installs the route once per process; called before any decoder opens.
pub(crate) fn route_to_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sets a process-wide function pointer to a function that lives forever.
        unsafe { ff::av_log_set_callback(Some(log_line)) };
    });
}

#[cfg(test)]
mod tests {
    use std::ptr;

    use super::*;

    #[test]
    fn levels_map_from_ffmpeg_to_tracing() {
        assert_eq!(map_level(ff::AV_LOG_PANIC), Mapped::Warn);
        assert_eq!(map_level(ff::AV_LOG_ERROR), Mapped::Warn);
        assert_eq!(map_level(ff::AV_LOG_WARNING), Mapped::Debug);
        assert_eq!(map_level(ff::AV_LOG_INFO), Mapped::Trace);
        assert_eq!(map_level(ff::AV_LOG_VERBOSE), Mapped::Drop);
        assert_eq!(map_level(ff::AV_LOG_DEBUG), Mapped::Drop);
    }

    #[test]
    fn lines_become_valid_utf8_without_their_line_break() {
        let mut raw = b"[h264 @ 0x1] bad \xd0\x20name\n\0garbage".to_vec();
        raw.resize(64, 0);
        assert_eq!(line_text(&raw).as_deref(), Some("[h264 @ 0x1] bad \u{fffd} name"));
        assert_eq!(line_text(b"\n\0"), None);
        assert_eq!(line_text(b"   \r\n"), None);
    }

    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_logged_through_ffmpeg_arrives_as_one_tracing_event() {
        route_to_tracing();
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let word = c"words";
            // SAFETY: format and arguments agree (%d: c_int, %s: C string); FFmpeg calls
            // the callback on this thread, where the subscriber above is the default.
            unsafe {
                ff::av_log(
                    ptr::null_mut(),
                    ff::AV_LOG_ERROR,
                    c"line %d with %s\n".as_ptr(),
                    7 as c_int,
                    word.as_ptr(),
                );
                ff::av_log(ptr::null_mut(), ff::AV_LOG_DEBUG, c"never formatted\n".as_ptr());
            }
        });
        let out = String::from_utf8(captured.0.lock().unwrap().clone()).expect("utf-8");
        assert!(out.contains("WARN ffmpeg: line 7 with words"), "{out}");
        assert!(!out.contains("never formatted"), "{out}");
        assert_eq!(out.lines().count(), 1, "{out}");
    }
}
