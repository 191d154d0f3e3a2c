//! SIP over TCP (RFC 3261 §18.3): messages follow each other on the connection, each one's
//! end given by its Content-Length. Blank lines between messages are keep-alive pings
//! (RFC 5626's CRLF), skipped.

/// The longest header block taken; past it the connection is not SIP.
pub const MAX_HEADER: usize = 16 << 10;
/// The longest body taken: a catalog part of a large NVR is tens of kilobytes, and devices
/// split longer catalogs over several MESSAGEs.
pub const MAX_BODY: usize = 4 << 20;

/// Why a TCP connection's bytes cannot be SIP; the connection is then closed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FramingError {
    #[error("SIP header block longer than {MAX_HEADER} bytes")]
    HeaderTooLong,
    #[error("SIP message over TCP has no Content-Length")]
    NoContentLength,
    #[error("SIP Content-Length {0:?} is not a number")]
    BadContentLength(String),
    #[error("SIP body of {0} bytes is over the {MAX_BODY}-byte limit")]
    BodyTooLong(usize),
}

/// One framing step over what a connection has sent so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Not a whole message yet: read more. `skip` leading bytes are keep-alive blank lines
    /// the caller may drop now.
    Partial { skip: usize },
    /// A whole message at `start..end`.
    Message { start: usize, end: usize },
}

/// Finds the first whole message in `buf`.
pub fn next_frame(buf: &[u8]) -> Result<Frame, FramingError> {
    let start = buf.iter().take_while(|b| matches!(b, b'\r' | b'\n')).count();
    let rest = &buf[start..];
    let Some(header_end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
        return match rest.len() > MAX_HEADER {
            true => Err(FramingError::HeaderTooLong),
            false => Ok(Frame::Partial { skip: start }),
        };
    };
    if header_end > MAX_HEADER {
        return Err(FramingError::HeaderTooLong);
    }
    let length = content_length(&rest[..header_end])?;
    if length > MAX_BODY {
        return Err(FramingError::BodyTooLong(length));
    }
    let end = start + header_end + 4 + length;
    match buf.len() >= end {
        true => Ok(Frame::Message { start, end }),
        false => Ok(Frame::Partial { skip: start }),
    }
}

/// The Content-Length (or compact `l`) header's value.
fn content_length(header: &[u8]) -> Result<usize, FramingError> {
    let text = String::from_utf8_lossy(header);
    for line in text.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("l") {
            let value = value.trim();
            return value
                .parse()
                .map_err(|_| FramingError::BadContentLength(value.chars().take(20).collect()));
        }
    }
    Err(FramingError::NoContentLength)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGISTER: &[u8] = b"REGISTER sip:a@b SIP/2.0\r\nCall-ID: 1\r\nContent-Length: 0\r\n\r\n";

    #[test]
    fn messages_one_after_another_with_pings_between() {
        let message = b"MESSAGE sip:a@b SIP/2.0\r\nl: 5\r\n\r\nhello";
        let buf = [b"\r\n\r\n".as_slice(), REGISTER, message].concat();
        let Frame::Message { start, end } = next_frame(&buf).unwrap() else {
            panic!()
        };
        assert_eq!((start, &buf[start..end]), (4, REGISTER));
        let rest = &buf[end..];
        let Frame::Message { start, end } = next_frame(rest).unwrap() else {
            panic!()
        };
        assert_eq!(&rest[start..end], message);
        assert_eq!(&rest[end - 5..end], b"hello");
    }

    #[test]
    fn a_message_cut_anywhere_is_partial() {
        let message = b"MESSAGE sip:a@b SIP/2.0\r\nContent-Length: 5\r\n\r\nhello";
        for cut in 0..message.len() {
            assert_eq!(
                next_frame(&message[..cut]),
                Ok(Frame::Partial { skip: 0 }),
                "{cut}"
            );
        }
        assert_eq!(
            next_frame(b"\r\n\r\nREG"),
            Ok(Frame::Partial { skip: 4 }),
            "the ping can go"
        );
    }

    #[test]
    fn what_is_not_sip_is_refused() {
        let no_length = b"MESSAGE sip:a@b SIP/2.0\r\nCall-ID: 1\r\n\r\n";
        assert_eq!(next_frame(no_length), Err(FramingError::NoContentLength));
        let bad = b"MESSAGE sip:a@b SIP/2.0\r\nContent-Length: -1\r\n\r\n";
        assert!(matches!(next_frame(bad), Err(FramingError::BadContentLength(_))));
        let huge = b"MESSAGE sip:a@b SIP/2.0\r\nContent-Length: 99999999\r\n\r\n";
        assert_eq!(next_frame(huge), Err(FramingError::BodyTooLong(99_999_999)));
        let endless = vec![b'a'; MAX_HEADER + 1];
        assert_eq!(next_frame(&endless), Err(FramingError::HeaderTooLong));
    }
}
