//! Micro-benchmarks of the hot paths: JSON body parsing (serde_json against simd-json, the
//! measurement behind the choice in docs/architecture.md), base64 into response buffers,
//! route lookup and policy decisions. Run: `cargo bench --bench hot_paths`.

use std::hint::black_box;

use agent_sandbox::bench_support::{builtin_endpoints, Group, Listener, Method, Policy, Router};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde::Deserialize;

#[derive(Deserialize)]
struct UploadBorrowed<'a> {
    #[serde(borrow)]
    path: &'a str,
    #[serde(borrow)]
    content_base64: &'a str,
}

fn upload_body(decoded_len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..decoded_len).map(|i| (i * 31 % 251) as u8).collect();
    let encoded = base64_simd::STANDARD.encode_to_string(&data);
    format!(r#"{{"path": "/home/user/data.bin", "content_base64": "{encoded}"}}"#).into_bytes()
}

fn json_bodies(c: &mut Criterion) {
    for (label, size) in [("1KiB", 1024), ("1MiB", 1 << 20), ("7MiB", 7 << 20)] {
        let body = upload_body(size);
        let mut group = c.benchmark_group(format!("upload_body_{label}"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        if size > 1 << 20 {
            group.sample_size(20);
        }
        group.bench_function("serde_json_borrowed", |b| {
            b.iter(|| {
                let parsed: UploadBorrowed = serde_json::from_slice(black_box(&body)).unwrap();
                black_box((parsed.path.len(), parsed.content_base64.len()))
            })
        });
        group.bench_function("serde_json_validate_then_parse", |b| {
            b.iter(|| {
                serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).unwrap();
                let parsed: UploadBorrowed = serde_json::from_slice(black_box(&body)).unwrap();
                black_box(parsed.content_base64.len())
            })
        });
        group.bench_function("simd_json_borrowed", |b| {
            b.iter_batched_ref(
                || body.clone(),
                |buf| {
                    let parsed: UploadBorrowed = simd_json::serde::from_slice(buf).unwrap();
                    black_box((parsed.path.len(), parsed.content_base64.len()))
                },
                BatchSize::LargeInput,
            )
        });
        group.finish();
    }
}

fn base64(c: &mut Criterion) {
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 256) as u8).collect();
    let encoded = base64_simd::STANDARD.encode_to_string(&data);
    let mut group = c.benchmark_group("base64_1MiB");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.bench_function("encode_into_response_buffer", |b| {
        let mut out = Vec::with_capacity(encoded.len() + 128);
        b.iter(|| {
            out.clear();
            out.extend_from_slice(br#"{"path":"/home/user/x","content_base64":""#);
            let start = out.len();
            out.resize(start + base64_simd::STANDARD.encoded_length(data.len()), 0);
            let written = base64_simd::STANDARD
                .encode(&data, base64_simd::Out::from_slice(&mut out[start..]));
            black_box(written.len());
            out.extend_from_slice(b"\"}");
            black_box(out.len())
        })
    });
    group.bench_function("decode", |b| {
        let mut out = vec![0u8; data.len()];
        b.iter(|| {
            let decoded = base64_simd::STANDARD
                .decode(encoded.as_bytes(), base64_simd::Out::from_slice(&mut out))
                .unwrap();
            black_box(decoded.len())
        })
    });
    group.finish();
}

fn routing(c: &mut Criterion) {
    let endpoints = builtin_endpoints();
    let router = Router::new(&endpoints, Listener::Api).expect("the built-in table is valid");
    c.bench_function("route_lookup_health", |b| {
        b.iter(|| {
            black_box(
                router
                    .lookup(Method::Get, black_box("/health"))
                    .map(|m| m.index),
            )
        })
    });
    c.bench_function("route_lookup_miss", |b| {
        b.iter(|| {
            black_box(
                router
                    .lookup(Method::Get, black_box("/no/such/path"))
                    .is_none(),
            )
        })
    });
    let policy = Policy::empty();
    c.bench_function("policy_decide_all_endpoints", |b| {
        b.iter(|| {
            for ep in &endpoints {
                black_box(policy.decide(&ep.spec, None, &[Group::DevTools]).enabled);
            }
        })
    });
}

criterion_group!(benches, json_bodies, base64, routing);
criterion_main!(benches);
