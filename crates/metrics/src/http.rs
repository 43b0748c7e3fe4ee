//! The scrape endpoint: `GET /metrics` over HTTP/1.x, one answer per connection.
//! Anything else gets 404 (or 400 when it is not HTTP); a peer has 5 s and 8 KiB to
//! send its request head, so a slow or hostile one holds nothing for long.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{debug, info};

const HEAD_MAX: usize = 8 << 10;

/// Serves the metrics on `listen` (host:port) until the returned task is aborted.
pub async fn serve(listen: &str) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let l = TcpListener::bind(listen)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("metrics: cannot listen on {listen}: {e}")))?;
    let addr = l.local_addr()?;
    info!(%addr, "serving metrics at http://{addr}/metrics");
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = l.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            tokio::spawn(async move {
                let r = tokio::time::timeout(std::time::Duration::from_secs(5), answer(&mut s)).await;
                if !matches!(r, Ok(Ok(()))) {
                    debug!(%peer, "metrics request not answered: {r:?}");
                }
            });
        }
    });
    Ok((addr, task))
}

async fn answer(s: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 || head.len() + n > HEAD_MAX {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(head.split(|b| *b == b'\n').next().unwrap_or_default()).into_owned();
    let mut parts = line.split_whitespace();
    let (method, path, version) = (parts.next(), parts.next(), parts.next());
    let (status, ctype, body) = match (method, path, version) {
        (Some("GET"), Some(p), Some(v))
            if v.starts_with("HTTP/") && (p == "/metrics" || p.starts_with("/metrics?")) =>
        {
            ("200 OK", prometheus_client::encoding::prometheus_text::CONTENT_TYPE, crate::render())
        }
        (Some(_), Some(_), Some(v)) if v.starts_with("HTTP/") => {
            ("404 Not Found", "text/plain", "only /metrics is served here\n".to_string())
        }
        _ => ("400 Bad Request", "text/plain", "not an HTTP request\n".to_string()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn answers_metrics_and_nothing_else() {
        let (addr, task) = serve("127.0.0.1:0").await.unwrap();
        let ok = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.contains("hivefs_resident_memory_bytes"), "{ok}");
        assert!(get(addr, b"GET / HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 404"));
        assert!(get(addr, b"\x00\x01garbage\n\n").await.starts_with("HTTP/1.1 400"));
        task.abort();
    }
}
