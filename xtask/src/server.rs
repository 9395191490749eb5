//! llama-server as a child process: started on a free local port, waited for until `/health`
//! answers, asked over plain HTTP/1.1 (the few requests xtask makes need no client library), and
//! stopped when dropped (SIGTERM, then killed if it has not exited within a few seconds), so that a
//! failing check never leaves a server behind and a stopped one exits normally (the overlay's
//! FRT_STATS print at exit).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running llama-server; stopped on drop. Its output goes to `log`.
pub struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// Starts `binary` with `args` (a model, context, slots…) and `env` on a free port, its stdout
    /// and stderr in `log`, and waits up to `timeout` for `/health` to answer 200.
    pub fn start(
        binary: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
        timeout: Duration,
    ) -> Result<Server> {
        let port = free_port()?;
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("opening {} twice", log.display()))?;
        let child = Command::new(binary)
            .args(args)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut server = Server {
            child,
            port,
            log: log.to_owned(),
        };
        server.wait_healthy(timeout)?;
        Ok(server)
    }

    fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("polling llama-server")? {
                bail!(
                    "llama-server exited ({status}) before it answered /health; its output is in {}",
                    self.log.display()
                );
            }
            if let Ok((200, _)) = request(self.port, "GET", "/health", "") {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!(
                    "llama-server did not answer /health within {} s; its output is in {}",
                    timeout.as_secs(),
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// POSTs a JSON body to `path`; the status and the body, whatever the status.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> Result<(u16, String)> {
        request(self.port, "POST", path, &body.to_string())
            .with_context(|| format!("POST {path} to llama-server"))
    }

    /// POSTs a streaming request and hangs up after `events` server-sent events (a client that
    /// goes away mid-answer); returns how many events came before it hung up.
    pub fn post_and_hang_up(
        &self,
        path: &str,
        body: &serde_json::Value,
        events: usize,
    ) -> Result<usize> {
        stream_and_hang_up(self.port, path, &body.to_string(), events)
            .with_context(|| format!("streaming POST {path} to llama-server"))
    }

    /// Whether `/health` answers 200 now.
    pub fn healthy(&self) -> bool {
        matches!(request(self.port, "GET", "/health", ""), Ok((200, _)))
    }

    /// The server's resident memory now, in bytes (Linux: /proc/PID/status), if it can be read.
    pub fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()?;
        Some(kib * 1024)
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// How long a stopped server may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl Drop for Server {
    fn drop(&mut self) {
        // llama-server shuts down on SIGTERM and returns from main, so that what a process prints
        // at exit is written; one that does not exit in time is killed.
        let pid = self.child.id().to_string();
        let asked = Command::new("kill")
            .args(["-TERM", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let deadline = Instant::now() + STOP_GRACE;
        while asked && Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A local port nobody listens on now (the OS picks it; the server binds it right after).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(listener
        .local_addr()
        .context("reading the free port")?
        .port())
}

/// Connects and sends one HTTP/1.1 request with `Connection: close`; the answer is left to read.
fn send_request(port: u16, method: &str, path: &str, body: &str) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).context("connecting")?;
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .context("setting a read timeout")?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .context("sending the request")?;
    Ok(stream)
}

/// One HTTP/1.1 request; returns the status and the body.
fn request(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut stream = send_request(port, method, path, body)?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .context("reading the answer")?;
    parse_response(&String::from_utf8_lossy(&answer))
}

/// A streaming POST read until `events` `data:` lines have come (or the answer ends), then the
/// connection dropped.
fn stream_and_hang_up(port: u16, path: &str, body: &str, events: usize) -> Result<usize> {
    let mut stream = send_request(port, "POST", path, body)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let seen = String::from_utf8_lossy(&got).matches("data: ").count();
        if seen >= events {
            return Ok(seen);
        }
        let n = stream.read(&mut buf).context("reading the stream")?;
        if n == 0 {
            return Ok(seen);
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// The status and body of an HTTP/1.1 response (a `Content-Length` body or one ended by the
/// connection's close; chunked bodies are joined).
fn parse_response(text: &str) -> Result<(u16, String)> {
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("an HTTP answer without an end of headers")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| format!("an HTTP status line without a status: {status_line:?}"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return Ok((status, body.to_owned()));
    }
    let mut joined = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .context("a chunked HTTP body cut short")?;
        let size = usize::from_str_radix(size.trim(), 16)
            .with_context(|| format!("a chunk size that is not hexadecimal: {size:?}"))?;
        if size == 0 {
            return Ok((status, joined));
        }
        let chunk = after
            .get(..size)
            .context("a chunk longer than the HTTP body")?;
        joined.push_str(chunk);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn parses_plain_and_chunked_bodies() {
        let plain = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";
        assert_eq!(
            parse_response(plain).unwrap(),
            (200, "{\"ok\":true}".to_owned())
        );
        let chunked =
            "HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (503, "{\"a\":1}".to_owned())
        );
        assert!(parse_response("HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response("garbage\r\n\r\n").is_err());
    }

    /// Reads one whole HTTP request from `stream` (headers, then Content-Length bytes): closing a
    /// socket with unread input resets the connection under the client.
    fn read_request(stream: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                if body.len() >= length {
                    return text;
                }
            }
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "the client closed before its request was complete");
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// A one-shot HTTP server on a free port answering `reply` to the first request, which it
    /// returns.
    fn fake_server(reply: &'static str) -> (u16, thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let got = read_request(&mut stream);
            stream.write_all(reply.as_bytes()).unwrap();
            got
        });
        (port, handle)
    }

    #[test]
    fn request_sends_the_body_and_reads_the_answer() {
        let (port, handle) = fake_server("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi");
        let (status, body) = request(port, "POST", "/completion", "{\"n\":1}").unwrap();
        assert_eq!((status, body.as_str()), (200, "hi"));
        let sent = handle.join().unwrap();
        assert!(sent.starts_with("POST /completion HTTP/1.1\r\n"), "{sent}");
        assert!(sent.contains("Content-Length: 7\r\n"), "{sent}");
        assert!(sent.ends_with("\r\n\r\n{\"n\":1}"), "{sent}");
    }

    #[test]
    fn a_streaming_client_hangs_up_after_the_events_it_wanted() {
        // The server sends two events and keeps the connection open: the client must close it.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            read_request(&mut stream);
            stream
                .write_all(b"HTTP/1.1 200 OK\r\n\r\ndata: {\"content\":\"a\"}\n\ndata: {\"content\":\"b\"}\n\n")
                .unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut rest = [0u8; 16];
            // 0 bytes: the client hung up (a timeout would be an error here).
            stream.read(&mut rest).unwrap()
        });
        assert_eq!(stream_and_hang_up(port, "/completion", "{}", 2).unwrap(), 2);
        assert_eq!(handle.join().unwrap(), 0);
        // An answer with fewer events than wanted ends with the connection: all it had.
        let (port, handle) = fake_server("HTTP/1.1 200 OK\r\n\r\ndata: {}\n\n");
        assert_eq!(stream_and_hang_up(port, "/completion", "{}", 5).unwrap(), 1);
        handle.join().unwrap();
    }

    #[test]
    fn a_dropped_server_is_asked_to_stop_and_exits_normally() {
        let dir = tempfile::tempdir().unwrap();
        let (ready, stopped) = (dir.path().join("ready"), dir.path().join("stopped"));
        let script = format!(
            "trap 'echo at-exit > {}; exit 0' TERM; touch {}; while true; do sleep 0.05; done",
            stopped.display(),
            ready.display()
        );
        let child = Command::new("sh").args(["-c", &script]).spawn().unwrap();
        // Signalled only once its handler is in place.
        let start = Instant::now();
        while !ready.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the script never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(Server {
            child,
            port: 0,
            log: dir.path().join("server.log"),
        });
        assert_eq!(std::fs::read_to_string(&stopped).unwrap().trim(), "at-exit");
    }

    #[test]
    fn a_server_that_exits_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let err = match Server::start(Path::new("false"), &[], &[], &log, Duration::from_secs(10)) {
            Ok(_) => panic!("`false` is not a server"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains("exited"), "{err}");
        assert!(err.contains("server.log"), "{err}");
    }
}
