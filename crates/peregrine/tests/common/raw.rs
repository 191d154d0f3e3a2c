//! Raw HTTP/1.1 for what reqwest cannot do.

use std::time::Duration;

use super::server::Server;

/// A raw HTTP/1.1 connection, for what reqwest cannot do: send a request's headers and only
/// part of its body, and see the connection close.
pub struct RawRequest(tokio::net::TcpStream);

impl RawRequest {
    /// Sends the head of a `POST path` announcing `length` body bytes, then `part` of them.
    pub async fn start(server: &Server, path: &str, content_type: &str, length: usize, part: &[u8]) -> Self {
        use tokio::io::AsyncWriteExt;
        let address = server.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        tcp.write_all(part).await.unwrap();
        Self(tcp)
    }

    pub async fn send(&mut self, rest: &[u8]) {
        tokio::io::AsyncWriteExt::write_all(&mut self.0, rest)
            .await
            .unwrap();
    }

    /// The status and the lower-cased head of the response, read within 20 s (a body
    /// timeout of 120 s is far away: an answer in time did not wait for the body).
    pub async fn response_head(&mut self) -> (u16, String) {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        let read = async {
            while !head.ends_with(b"\r\n\r\n") {
                assert_eq!(
                    self.0.read(&mut byte).await.unwrap(),
                    1,
                    "connection closed mid-head"
                );
                head.push(byte[0]);
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the response comes without the rest of the body");
        let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head)
    }

    /// Reads until the server closes the connection.
    pub async fn closed_by_server(&mut self) {
        use tokio::io::AsyncReadExt;
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), self.0.read_to_end(&mut rest))
            .await
            .expect("the server closes the connection")
            .unwrap();
    }
}
