//! A TCP proxy that adds a fixed latency to every request/response turn, to put an object
//! store "far away" for bench/query and bench/ingest (`--table s3://…`).
//!
//! Usage: latency_proxy LISTEN_PORT UPSTREAM_HOST:PORT LATENCY_MS
//!
//! Each connection forwards both ways; the first bytes of every answer that follows bytes from
//! the client are held for LATENCY_MS, so each HTTP request on a keep-alive connection pays
//! the latency once, as a round trip to a remote store does. Prints `listening PORT` when
//! ready.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream, latency] = args.as_slice() else {
        eprintln!("usage: latency_proxy LISTEN_PORT UPSTREAM_HOST:PORT LATENCY_MS");
        std::process::exit(2);
    };
    let latency = Duration::from_millis(latency.parse().expect("LATENCY_MS"));
    let listener = TcpListener::bind(("127.0.0.1", listen.parse::<u16>().expect("port")))
        .await
        .expect("bind");
    println!("listening {}", listener.local_addr().expect("addr").port());
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let spoke = Arc::new(AtomicBool::new(false));
            let s2 = spoke.clone();
            let up = tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    s2.store(true, Ordering::SeqCst);
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = sw.shutdown().await;
            });
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = sr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if spoke.swap(false, Ordering::SeqCst) {
                    tokio::time::sleep(latency).await;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = cw.shutdown().await;
            up.abort();
        });
    }
}
