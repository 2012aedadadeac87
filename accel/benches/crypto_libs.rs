//! Per-packet cost of the ESP transforms in the candidate Rust crypto crates.
//!
//! Every benchmark does the work one ESP packet needs on the data path, with all
//! per-SA state (key schedule, GHASH key, HMAC ipad/opad state) prepared once
//! outside the timed loop:
//!
//! * AES-GCM and ChaCha20-Poly1305: seal in place, 8-byte AAD (SPI || seq),
//!   12-byte nonce, detached 16-byte tag; open in place with the tag
//!   following the ciphertext.
//! * AES-CBC / 3DES-CBC: no padding, explicit IV, in place.
//! * HMAC-SHA1 / HMAC-SHA-256: clone precomputed keyed state, update, finalize.
//!
//! Ids are `<algorithm>[-dec|-open]/<crate>/<bytes>` with `Throughput::Bytes`.
//! CBC sizes are block multiples: 1424 = a 1420-byte payload plus the 2-byte
//! ESP trailer, padded to 16.
//!
//! It checks no output: `tests/crypto_libs_agree.rs` checks, with these same
//! calls, that every crate here gives identical bytes for every algorithm
//! here, and fails when this file times one it does not compare.
//!
//! Quick run on a small shared box:
//! `cargo bench --bench crypto_libs -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BatchSize, BenchmarkGroup, BenchmarkId,
    Criterion, Throughput,
};

use aes::cipher::{
    BlockCipherDecrypt, BlockCipherEncrypt, BlockModeDecrypt, BlockModeEncrypt, InOutBuf, InnerIvInit,
};
use aes_gcm::aead::{AeadInOut, KeyInit, Nonce, Tag};
use hmac::{Hmac, Mac};

const AEAD_SIZES: [usize; 3] = [64, 512, 1420];
const CBC_SIZES: [usize; 3] = [64, 512, 1424];
const MAC_SIZES: [usize; 3] = [64, 512, 1420];

const KEY: [u8; 32] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
];
/// Three distinct, non-weak DES keys (aws-lc-rs rejects weak / repeated subkeys).
const TDES_KEY: [u8; 24] = [
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x45,
    0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23,
];
const NONCE: [u8; 12] = [0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 0, 0, 0, 0, 1];
const IV16: [u8; 16] = [0x3c; 16];
const IV8: [u8; 8] = [0x3c; 8];
/// ESP AAD without ESN: SPI || sequence number.
const AAD: [u8; 8] = [0x00, 0x00, 0x10, 0x01, 0x00, 0x00, 0x00, 0x2a];
const TAG_LEN: usize = 16;

// ---------------------------------------------------------------- AES-GCM

fn bench_gcm<A: AeadInOut + KeyInit>(
    c: &mut Criterion,
    name: &str,
    key: &[u8],
    ring_alg: &'static ring::aead::Algorithm,
    aws_alg: &'static aws_lc_rs::aead::Algorithm,
) {
    let rc = A::new_from_slice(key).expect("key length");
    let rc_nonce = Nonce::<A>::try_from(&NONCE[..]).expect("nonce length");
    let ring_key =
        ring::aead::LessSafeKey::new(ring::aead::UnboundKey::new(ring_alg, key).expect("key length"));
    let aws_key = aws_lc_rs::aead::LessSafeKey::new(
        aws_lc_rs::aead::UnboundKey::new(aws_alg, key).expect("key length"),
    );

    let mut g = c.benchmark_group(name);
    for len in AEAD_SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let mut buf = vec![0xa5u8; len];
        g.bench_function(BenchmarkId::new("rustcrypto", len), |b| {
            b.iter(|| {
                rc.encrypt_inout_detached(&rc_nonce, &AAD, black_box(&mut buf[..]).into())
                    .expect("seal")
            })
        });
        g.bench_function(BenchmarkId::new("ring", len), |b| {
            b.iter(|| {
                ring_key
                    .seal_in_place_separate_tag(
                        ring::aead::Nonce::assume_unique_for_key(NONCE),
                        ring::aead::Aad::from(AAD),
                        black_box(&mut buf[..]),
                    )
                    .expect("seal")
            })
        });
        g.bench_function(BenchmarkId::new("aws-lc-rs", len), |b| {
            b.iter(|| {
                aws_key
                    .seal_in_place_separate_tag(
                        aws_lc_rs::aead::Nonce::assume_unique_for_key(NONCE),
                        aws_lc_rs::aead::Aad::from(AAD),
                        black_box(&mut buf[..]),
                    )
                    .expect("seal")
            })
        });
    }
    g.finish();

    // Open: the packet buffer is ciphertext || ICV, as on the wire. Each
    // iteration needs a fresh authentic packet, so it is copied in untimed setup.
    let mut g = c.benchmark_group(format!("{name}-open"));
    for len in AEAD_SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let mut packet = vec![0xa5u8; len + TAG_LEN];
        let tag = ring_key
            .seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(NONCE),
                ring::aead::Aad::from(AAD),
                &mut packet[..len],
            )
            .expect("seal");
        packet[len..].copy_from_slice(tag.as_ref());

        g.bench_function(BenchmarkId::new("rustcrypto", len), |b| {
            b.iter_batched_ref(
                || packet.clone(),
                |p| {
                    let (ct, icv) = p.split_at_mut(len);
                    let icv = Tag::<A>::try_from(&icv[..]).expect("tag length");
                    rc.decrypt_inout_detached(&rc_nonce, &AAD, ct.into(), &icv)
                        .expect("open")
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_function(BenchmarkId::new("ring", len), |b| {
            b.iter_batched_ref(
                || packet.clone(),
                |p| {
                    ring_key
                        .open_in_place(
                            ring::aead::Nonce::assume_unique_for_key(NONCE),
                            ring::aead::Aad::from(AAD),
                            p,
                        )
                        .expect("open")
                        .len()
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_function(BenchmarkId::new("aws-lc-rs", len), |b| {
            b.iter_batched_ref(
                || packet.clone(),
                |p| {
                    aws_key
                        .open_in_place(
                            aws_lc_rs::aead::Nonce::assume_unique_for_key(NONCE),
                            aws_lc_rs::aead::Aad::from(AAD),
                            p,
                        )
                        .expect("open")
                        .len()
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn chacha20poly1305(c: &mut Criterion) {
    bench_gcm::<chacha20poly1305::ChaCha20Poly1305>(
        c,
        "chacha20poly1305",
        &KEY,
        &ring::aead::CHACHA20_POLY1305,
        &aws_lc_rs::aead::CHACHA20_POLY1305,
    );
}

fn aes128gcm(c: &mut Criterion) {
    bench_gcm::<aes_gcm::Aes128Gcm>(
        c,
        "aes128gcm",
        &KEY[..16],
        &ring::aead::AES_128_GCM,
        &aws_lc_rs::aead::AES_128_GCM,
    );
}

fn aes256gcm(c: &mut Criterion) {
    bench_gcm::<aes_gcm::Aes256Gcm>(
        c,
        "aes256gcm",
        &KEY,
        &ring::aead::AES_256_GCM,
        &aws_lc_rs::aead::AES_256_GCM,
    );
}

// ---------------------------------------------------------------- CBC

/// RustCrypto CBC over a borrowed, pre-expanded block cipher: per packet only
/// the IV is set, no key schedule is run.
fn rc_cbc_encrypt<C: BlockCipherEncrypt>(cipher: &C, iv: &[u8], buf: &mut [u8]) {
    let mut mode = cbc::Encryptor::<&C>::inner_iv_slice_init(cipher, iv).expect("iv length");
    let (blocks, tail) = InOutBuf::from(buf).into_chunks();
    assert!(tail.is_empty(), "CBC input must be a block multiple");
    mode.encrypt_blocks_inout(blocks);
}

fn rc_cbc_decrypt<C: BlockCipherDecrypt>(cipher: &C, iv: &[u8], buf: &mut [u8]) {
    let mut mode = cbc::Decryptor::<&C>::inner_iv_slice_init(cipher, iv).expect("iv length");
    let (blocks, tail) = InOutBuf::from(buf).into_chunks();
    assert!(tail.is_empty(), "CBC input must be a block multiple");
    mode.decrypt_blocks_inout(blocks);
}

fn aws_cbc_keys(
    alg: &'static aws_lc_rs::cipher::Algorithm,
    key: &[u8],
) -> (aws_lc_rs::cipher::EncryptingKey, aws_lc_rs::cipher::DecryptingKey) {
    use aws_lc_rs::cipher::{DecryptingKey, EncryptingKey, UnboundCipherKey};
    let ek = EncryptingKey::cbc(UnboundCipherKey::new(alg, key).expect("key")).expect("key");
    let dk = DecryptingKey::cbc(UnboundCipherKey::new(alg, key).expect("key")).expect("key");
    (ek, dk)
}

/// The aws-lc-rs context for a CBC IV of 8 (3DES) or 16 (AES) bytes.
#[allow(deprecated)]
fn aws_iv(iv: &[u8]) -> aws_lc_rs::cipher::EncryptionContext {
    use aws_lc_rs::cipher::EncryptionContext;
    match iv.len() {
        16 => EncryptionContext::Iv128(iv.try_into().expect("iv")),
        8 => EncryptionContext::Iv64(iv.try_into().expect("iv")),
        n => panic!("bad CBC IV length {n}"),
    }
}

fn bench_cbc<E: BlockCipherEncrypt, D: BlockCipherDecrypt>(
    c: &mut Criterion,
    name: &str,
    rc_enc: &E,
    rc_dec: &D,
    aws_alg: &'static aws_lc_rs::cipher::Algorithm,
    key: &[u8],
    iv: &[u8],
) {
    let (aws_ek, aws_dk) = aws_cbc_keys(aws_alg, key);

    let mut g = c.benchmark_group(name);
    for len in CBC_SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let mut buf = vec![0xa5u8; len];
        g.bench_function(BenchmarkId::new("rustcrypto", len), |b| {
            b.iter(|| rc_cbc_encrypt(rc_enc, iv, black_box(&mut buf[..])))
        });
        g.bench_function(BenchmarkId::new("aws-lc-rs", len), |b| {
            b.iter(|| {
                aws_ek
                    .less_safe_encrypt(black_box(&mut buf[..]), aws_iv(iv))
                    .expect("encrypt")
            })
        });
    }
    g.finish();

    // CBC decryption has no integrity check, so decrypting the same buffer
    // repeatedly costs exactly what decrypting a real packet does.
    let mut g = c.benchmark_group(format!("{name}-dec"));
    for len in CBC_SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let mut buf = vec![0xa5u8; len];
        g.bench_function(BenchmarkId::new("rustcrypto", len), |b| {
            b.iter(|| rc_cbc_decrypt(rc_dec, iv, black_box(&mut buf[..])))
        });
        g.bench_function(BenchmarkId::new("aws-lc-rs", len), |b| {
            b.iter(|| {
                aws_dk
                    .decrypt(black_box(&mut buf[..]), aws_iv(iv).into())
                    .expect("decrypt")
                    .len()
            })
        });
    }
    g.finish();
}

fn aes128cbc(c: &mut Criterion) {
    let k = &KEY[..16];
    let enc = aes::Aes128Enc::new_from_slice(k).expect("key");
    let dec = aes::Aes128Dec::new_from_slice(k).expect("key");
    bench_cbc(c, "aes128cbc", &enc, &dec, &aws_lc_rs::cipher::AES_128, k, &IV16);
}

fn aes256cbc(c: &mut Criterion) {
    let enc = aes::Aes256Enc::new_from_slice(&KEY).expect("key");
    let dec = aes::Aes256Dec::new_from_slice(&KEY).expect("key");
    bench_cbc(
        c,
        "aes256cbc",
        &enc,
        &dec,
        &aws_lc_rs::cipher::AES_256,
        &KEY,
        &IV16,
    );
}

#[allow(deprecated)] // aws-lc-rs marks every DES item deprecated (legacy-des feature)
fn tdescbc(c: &mut Criterion) {
    let tdes = des::TdesEde3::new_from_slice(&TDES_KEY).expect("key");
    bench_cbc(
        c,
        "3descbc",
        &tdes,
        &tdes,
        &aws_lc_rs::cipher::DES_EDE3_FOR_LEGACY_USE_ONLY,
        &TDES_KEY,
        &IV8,
    );
}

// ---------------------------------------------------------------- HMAC

fn bench_hmac<H>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    keyed: &H,
    ring_key: &ring::hmac::Key,
    aws_key: &aws_lc_rs::hmac::Key,
) where
    H: Mac + Clone,
{
    for len in MAC_SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let buf = vec![0xa5u8; len];
        g.bench_function(BenchmarkId::new("rustcrypto", len), |b| {
            b.iter(|| {
                let mut m = keyed.clone();
                m.update(black_box(&buf));
                m.finalize().into_bytes()
            })
        });
        g.bench_function(BenchmarkId::new("ring", len), |b| {
            b.iter(|| ring::hmac::sign(ring_key, black_box(&buf)))
        });
        g.bench_function(BenchmarkId::new("aws-lc-rs", len), |b| {
            b.iter(|| aws_lc_rs::hmac::sign(aws_key, black_box(&buf)))
        });
    }
}

fn hmac_sha1(c: &mut Criterion) {
    let k = &KEY[..20];
    let keyed = Hmac::<sha1::Sha1>::new_from_slice(k).expect("key");
    let ring_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, k);
    let aws_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, k);
    let mut g = c.benchmark_group("hmacsha1");
    bench_hmac(&mut g, &keyed, &ring_key, &aws_key);
    g.finish();
}

fn hmac_sha256(c: &mut Criterion) {
    let keyed = Hmac::<sha2::Sha256>::new_from_slice(&KEY).expect("key");
    let ring_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &KEY);
    let aws_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &KEY);
    let mut g = c.benchmark_group("hmacsha256");
    bench_hmac(&mut g, &keyed, &ring_key, &aws_key);
    g.finish();
}

fn config() -> Criterion {
    // The figures go to docs/results.md through scripts/crypto-table.py; no
    // criterion charts (they would need a font when built beside `bench`).
    Criterion::default()
        .without_plots()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = aes128gcm, aes256gcm, chacha20poly1305, aes128cbc, aes256cbc, tdescbc, hmac_sha1, hmac_sha256
}
criterion_main!(benches);
