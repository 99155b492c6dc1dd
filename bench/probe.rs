//! The benchmark's one-connection client: POSTs one body over one keep-alive connection, back to
//! back, for a number of seconds, and times every request (from the write of the request to the
//! last byte of its response). wrk reports percentiles corrected for coordinated omission; this
//! prints the latencies as recorded too, from the same samples, so the two can be told apart.
//!
//! `cargo build --release --example probe`, then
//! `target/release/examples/probe ADDR PATH KEY SECONDS [RATE]` with the body on stdin: back to
//! back, or with RATE, one request every 1/RATE s (a light load). Prints one line:
//! `PROBE requests=… duration_us=… errors=… p50=… p99=… p999=… max=… over500=… cp50=… cp99=…
//! cp999=…` (µs; `over500`: requests slower than 500 µs; `cp…`: wrk's correction applied to the
//! same samples).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(5..=6).contains(&args.len()) {
        eprintln!("usage: probe ADDR PATH KEY SECONDS [RATE] < body");
        std::process::exit(2);
    }
    let (addr, path, key) = (&args[1], &args[2], &args[3]);
    let seconds: f64 = args[4]
        .parse()
        .unwrap_or_else(|_| fail("SECONDS must be a number"));
    let every = args.get(5).map(|r| match r.parse::<f64>() {
        Ok(rate) if rate > 0.0 => Duration::from_secs_f64(1.0 / rate),
        _ => fail("RATE must be a positive number of requests per second"),
    });
    let mut body = Vec::new();
    std::io::stdin()
        .read_to_end(&mut body)
        .unwrap_or_else(|e| fail(&format!("stdin: {e}")));
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {key}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);

    let stream = TcpStream::connect(addr).unwrap_or_else(|e| fail(&format!("connect {addr}: {e}")));
    stream.set_nodelay(true).ok();
    let mut writer = stream
        .try_clone()
        .unwrap_or_else(|e| fail(&format!("socket: {e}")));
    let mut reader = BufReader::with_capacity(64 * 1024, stream);

    let mut latencies_us: Vec<u64> = Vec::with_capacity(1 << 20);
    let mut errors = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut next = start;
    while Instant::now() < end {
        if let Some(every) = every {
            // Paced: the next request leaves at its slot, whatever the last one took.
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += every;
        }
        let sent = Instant::now();
        writer
            .write_all(&request)
            .unwrap_or_else(|e| fail(&format!("write: {e}")));
        let status = read_response(&mut reader).unwrap_or_else(|e| fail(&format!("read: {e}")));
        latencies_us.push(sent.elapsed().as_micros() as u64);
        if !(200..300).contains(&status) {
            errors += 1;
        }
    }
    let duration_us = start.elapsed().as_micros() as u64;
    let requests = latencies_us.len() as u64;

    let mut recorded = latencies_us.clone();
    recorded.sort_unstable();
    let over500 = recorded.iter().filter(|&&l| l > 500).count();
    let corrected = corrected(&latencies_us, duration_us / requests.max(1));
    println!(
        "PROBE requests={requests} duration_us={duration_us} errors={errors} p50={} p99={} p999={} max={} \
         over500={over500} cp50={} cp99={} cp999={}",
        percentile(&recorded, 50.0),
        percentile(&recorded, 99.0),
        percentile(&recorded, 99.9),
        recorded.last().copied().unwrap_or(0),
        percentile_counts(&corrected, 50.0),
        percentile_counts(&corrected, 99.0),
        percentile_counts(&corrected, 99.9),
    );
}

fn fail(msg: &str) -> ! {
    eprintln!("probe: {msg}");
    std::process::exit(1);
}

/// Reads one HTTP/1.1 response (Content-Length or chunked) whole; returns its status.
fn read_response(r: &mut impl BufRead) -> std::io::Result<u16> {
    let mut line = String::new();
    read_line(r, &mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let (mut length, mut chunked) = (0usize, false);
    loop {
        read_line(r, &mut line)?;
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().map_err(std::io::Error::other)?;
        } else if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    if !chunked {
        skip(r, length)?;
        return Ok(status);
    }
    loop {
        read_line(r, &mut line)?;
        let size = line.trim_end().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size, 16).map_err(std::io::Error::other)?;
        if size == 0 {
            // Trailers, if any, end with an empty line.
            loop {
                read_line(r, &mut line)?;
                if line == "\r\n" {
                    return Ok(status);
                }
            }
        }
        skip(r, size + 2)?;
    }
}

fn read_line(r: &mut impl BufRead, line: &mut String) -> std::io::Result<()> {
    line.clear();
    if r.read_line(line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    Ok(())
}

fn skip(r: &mut impl BufRead, mut n: usize) -> std::io::Result<()> {
    while n > 0 {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let take = buf.len().min(n);
        r.consume(take);
        n -= take;
    }
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// wrk's correction for coordinated omission: a request that took `l` µs stands for the requests
/// that would have been sent every `interval` µs meanwhile, at `l - interval`, `l - 2 interval`, …
/// down to above one interval. Returns counts per µs.
fn corrected(latencies: &[u64], interval: u64) -> Vec<u64> {
    let max = latencies.iter().copied().max().unwrap_or(0) as usize;
    let mut counts = vec![0u64; max + 1];
    for &l in latencies {
        counts[l as usize] += 1;
    }
    if interval == 0 {
        return counts;
    }
    let recorded = counts.clone();
    for (l, &n) in recorded.iter().enumerate().skip(2 * interval as usize) {
        let mut m = l as u64 - interval;
        while n > 0 && m > interval {
            counts[m as usize] += n;
            m -= interval;
        }
    }
    counts
}

fn percentile_counts(counts: &[u64], p: f64) -> u64 {
    let total: u64 = counts.iter().sum();
    let want = ((p / 100.0) * total as f64).ceil() as u64;
    let mut seen = 0;
    for (l, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= want.max(1) {
            return l as u64;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_correction_adds_the_requests_a_stall_held_back_as_wrk_does() {
        // (latencies µs, interval µs, corrected counts as (µs, count), p50, p99)
        type Case = (&'static [u64], u64, &'static [(usize, u64)], u64, u64);
        let cases: [Case; 3] = [
            // Nothing slower than two intervals: unchanged.
            (&[10, 12, 19], 10, &[(10, 1), (12, 1), (19, 1)], 12, 19),
            // 35 µs at a 10 µs interval also stands for requests at 25 and 15 (not 5: not above
            // one interval).
            (&[10, 10, 35], 10, &[(10, 2), (15, 1), (25, 1), (35, 1)], 15, 35),
            // Exactly two intervals: one more at one interval is not above it.
            (&[10, 20], 10, &[(10, 1), (20, 1)], 10, 20),
        ];
        for (latencies, interval, want, p50, p99) in cases {
            let counts = corrected(latencies, interval);
            let got: Vec<(usize, u64)> = counts
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(l, n)| (l, *n))
                .collect();
            assert_eq!(got, want, "{latencies:?}");
            assert_eq!(percentile_counts(&counts, 50.0), p50, "{latencies:?}");
            assert_eq!(percentile_counts(&counts, 99.0), p99, "{latencies:?}");
        }
    }

    #[test]
    fn recorded_percentiles_are_nearest_rank() {
        let sorted: Vec<u64> = (1..=200).collect();
        assert_eq!(percentile(&sorted, 50.0), 100);
        assert_eq!(percentile(&sorted, 99.0), 198);
        assert_eq!(percentile(&sorted, 99.9), 200);
        assert_eq!(percentile(&[], 99.0), 0);
    }

    #[test]
    fn responses_are_read_whole_with_a_length_or_chunked() {
        let cases: [(&str, u16); 3] = [
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", 200),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\n\r\n",
                200,
            ),
            (
                "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}",
                429,
            ),
        ];
        for (raw, status) in cases {
            // Twice in a row on one connection: the first read must stop exactly at its end.
            let twice = format!("{raw}{raw}");
            let mut r = std::io::BufReader::new(twice.as_bytes());
            assert_eq!(read_response(&mut r).unwrap(), status, "{raw:?}");
            assert_eq!(read_response(&mut r).unwrap(), status, "{raw:?}");
            assert!(read_response(&mut r).is_err(), "{raw:?}: nothing is left");
        }
        let bad = [
            "garbage\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\n",
        ];
        for raw in bad {
            assert!(
                read_response(&mut std::io::BufReader::new(raw.as_bytes())).is_err(),
                "{raw:?}"
            );
        }
    }
}
