#!/usr/bin/env python3
"""Recompute every vector in accel/tests/vectors/mod.rs and assert equality.

Reads ONLY vectors.rs (the deliverable), so the Rust constants themselves are
what is checked.  Needs `cryptography` (tested with 48.x).
"""
import hashlib, hmac, os, re, struct, sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
try:
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
except ImportError:  # older cryptography
    TripleDES = algorithms.TripleDES

RS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mod.rs')
C = {}
# rustfmt moves a long value to the next line: the value may follow a newline.
for m in re.finditer(r'^pub const ([A-Z0-9_]+): ([^=\n]+?) =\s+(.+?);$', open(RS).read(), re.M | re.S):
    name, ty, val = m.group(1), m.group(2).strip(), m.group(3).strip()
    assert name not in C, f'duplicate {name}'
    if ty == '&str':
        v = val.strip('"'); assert re.fullmatch(r'(?:[0-9a-f]{2})*', v), f'{name}: not lowercase even-length hex'
        C[name] = bytes.fromhex(v)
    elif ty == 'bool':
        C[name] = {'true': True, 'false': False}[val]
    elif ty in ('u8', 'u32'):
        C[name] = int(val, 0)
        assert C[name] < (1 << (8 if ty == 'u8' else 32))
    else:
        raise SystemExit(f'unhandled type {ty} for {name}')
used = set()
def g(k):
    used.add(k); return C[k]
def has(k):
    return k in C
n_ok = 0
def ok(label):
    global n_ok; n_ok += 1; print(f'OK  {label}')
def eq(a, b, what):
    assert a == b, f'MISMATCH {what}:\n  got      {a.hex() if isinstance(a, bytes) else a}\n  expected {b.hex() if isinstance(b, bytes) else b}'

def aes_cbc(key, iv, data, enc=True):
    c = Cipher(algorithms.AES(key), modes.CBC(iv))
    x = c.encryptor() if enc else c.decryptor()
    return x.update(data) + x.finalize()
def tdes(key, mode, data, enc=True):
    c = Cipher(TripleDES(key), mode)
    x = c.encryptor() if enc else c.decryptor()
    return x.update(data) + x.finalize()
def check_trailer(pt, payload, padlen, nh, what):
    eq(pt[-1], nh, f'{what} next header'); eq(pt[-2], padlen, f'{what} pad length')
    eq(pt[-2 - padlen:-2], bytes(range(1, padlen + 1)), f'{what} monotonic padding (RFC 4303 2.4)')
    eq(pt[:-2 - padlen], payload, f'{what} payload')
def ipv4_checksum_ok(h):
    s = sum(struct.unpack('!10H', h))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return s == 0xffff

# --- 1. draft-mcgrew-gcm-test-01 ------------------------------------------------
gcm_cases = sorted({int(m.group(2)) for k in C for m in [re.match(r'(GCM|GMAC)_ESP_CASE_(\d+)_KEY$', k)] if m})
for i in gcm_cases:
    gmac = has(f'GMAC_ESP_CASE_{i}_KEY')
    P = f'{"GMAC" if gmac else "GCM"}_ESP_CASE_{i}'
    key, salt, keymat = g(f'{P}_KEY'), g(f'{P}_SALT'), g(f'{P}_KEYMAT')
    spi, esn, hi, lo = g(f'{P}_SPI'), g(f'{P}_ESN'), g(f'{P}_SEQ_HI'), g(f'{P}_SEQ_LO')
    iv, nonce, aad = g(f'{P}_IV'), g(f'{P}_NONCE'), g(f'{P}_AAD')
    payload, padlen, nh = g(f'{P}_PAYLOAD'), g(f'{P}_PAD_LEN'), g(f'{P}_NEXT_HEADER')
    icv, packet = g(f'{P}_ICV'), g(f'{P}_PACKET')
    assert len(key) in (16, 24, 32) and len(salt) == 4 and len(iv) == 8
    eq(keymat, key + salt, f'{P} KEYMAT = KEY || SALT')
    eq(nonce, salt + iv, f'{P} NONCE = SALT || IV')
    exp_aad = struct.pack('!I', spi) + (struct.pack('!I', hi) if esn else b'') + struct.pack('!I', lo)
    if not esn: eq(hi, 0, f'{P} SEQ_HI must be 0 without ESN')
    if gmac:
        clear = g(f'{P}_PLAINTEXT_CLEAR')
        eq(aad, exp_aad + iv + clear, f'{P} GMAC AAD = SPI||SEQ||IV||payload')
        tag = AESGCM(key).encrypt(nonce, b'', aad)
        eq(tag, icv, f'{P} GMAC tag')
        eq(packet, struct.pack('!II', spi, lo) + iv + clear + tag, f'{P} packet layout')
        check_trailer(clear, payload, padlen, nh, P)
        AESGCM(key).decrypt(nonce, tag, aad)
    else:
        pt, ct_icv = g(f'{P}_PLAINTEXT'), g(f'{P}_CIPHERTEXT_ICV')
        eq(aad, exp_aad, f'{P} AAD = SPI || [SEQ_HI] || SEQ_LO')
        out = AESGCM(key).encrypt(nonce, pt, aad)
        eq(out, ct_icv, f'{P} AES-GCM encrypt(plaintext)')
        eq(AESGCM(key).decrypt(nonce, ct_icv, aad), pt, f'{P} AES-GCM decrypt')
        eq(ct_icv[-16:], icv, f'{P} ICV = last 16 octets')
        eq(packet, struct.pack('!II', spi, lo) + iv + ct_icv, f'{P} packet = SPI||SEQ_LO||IV||CT||ICV')
        check_trailer(pt, payload, padlen, nh, P)
        assert len(pt) % 4 == 0, f'{P} ESP 4-octet alignment'
    ok(f'{P}: AES-{len(key)*8} {"GMAC" if gmac else "GCM"}-ESP, {"ESN seq=%08x:%08x" % (hi, lo) if esn else "seq=%08x" % lo}, '
       f'spi={spi:08x}, pt {len(payload)}+{padlen}+2 octets, NH={nh}')

# --- 2. RFC 3602 ----------------------------------------------------------------
for i in range(1, 9):
    P = f'AES_CBC_RFC3602_CASE_{i}'
    key, iv, pt, ct = g(f'{P}_KEY'), g(f'{P}_IV'), g(f'{P}_PLAINTEXT'), g(f'{P}_CIPHERTEXT')
    eq(aes_cbc(key, iv, pt), ct, f'{P} AES-CBC encrypt')
    eq(aes_cbc(key, iv, ct, enc=False), pt, f'{P} AES-CBC decrypt')
    extra = ''
    if i >= 5:
        spi, seq, payload = g(f'{P}_SPI'), g(f'{P}_SEQ'), g(f'{P}_PAYLOAD')
        padlen, nh, packet = g(f'{P}_PAD_LEN'), g(f'{P}_NEXT_HEADER'), g(f'{P}_PACKET')
        check_trailer(pt, payload, padlen, nh, P)
        eq(packet, struct.pack('!II', spi, seq) + iv + ct, f'{P} packet = SPI||SEQ||IV||CT')
        extra = f', ESP spi={spi:x} seq={seq} NH={nh} pad={padlen}'
        if has(f'{P}_OUTER_IP_HEADER'):
            oh = g(f'{P}_OUTER_IP_HEADER')
            assert len(oh) == 20 and oh[9] == 50, f'{P} outer header proto must be 50 (ESP)'
            eq(int.from_bytes(oh[2:4], 'big'), 20 + len(packet), f'{P} outer IPv4 total length')
            assert ipv4_checksum_ok(oh), f'{P} outer IPv4 header checksum'
            extra += ', outer IPv4 hdr len+checksum ok'
    ok(f'{P}: AES-{len(key)*8}-CBC {len(pt)} octets{extra}')

# --- 3. HMAC --------------------------------------------------------------------
for i in range(1, 8):
    P = f'HMAC_SHA1_RFC2202_CASE_{i}'
    d = hmac.new(g(f'{P}_KEY'), g(f'{P}_DATA'), hashlib.sha1).digest()
    eq(d, g(f'{P}_DIGEST'), f'{P} HMAC-SHA-1'); eq(d[:12], g(f'{P}_DIGEST_96'), f'{P} HMAC-SHA-1-96')
    ok(f'{P}: HMAC-SHA-1 and HMAC-SHA-1-96')
eq(g('HMAC_SHA1_RFC2202_CASE_5_DIGEST_96'), bytes.fromhex('4c1a03424b55e07fe7f27be1'), 'RFC 2202 printed digest-96')
for i in range(1, 8):
    P = f'HMAC_SHA256_RFC4231_CASE_{i}'
    d = hmac.new(g(f'{P}_KEY'), g(f'{P}_DATA'), hashlib.sha256).digest()
    if i == 5:
        eq(d[:16], g(f'{P}_DIGEST_128'), f'{P} truncated HMAC-SHA-256'); ok(f'{P}: HMAC-SHA-256 truncated to 128 bits')
    else:
        eq(d, g(f'{P}_DIGEST'), f'{P} HMAC-SHA-256'); ok(f'{P}: HMAC-SHA-256')
for i in range(1, 5):
    P = f'HMAC_SHA256_128_RFC4868_AUTH256_{i}'
    key = g(f'{P}_KEY'); assert len(key) == 32
    d = hmac.new(key, g(f'{P}_DATA'), hashlib.sha256).digest()
    eq(d, g(f'{P}_PRF'), f'{P} PRF-HMAC-SHA-256'); eq(d[:16], g(f'{P}_ICV_128'), f'{P} HMAC-SHA-256-128')
    ok(f'{P}: PRF-HMAC-SHA-256 and HMAC-SHA-256-128')

# --- 4. 3DES --------------------------------------------------------------------
k = g('TDES_SP800_67_ECB_KEY'); pt = g('TDES_SP800_67_ECB_PLAINTEXT'); ct = g('TDES_SP800_67_ECB_CIPHERTEXT')
eq(tdes(k, modes.ECB(), pt), ct, 'SP 800-67 TDEA ECB'); eq(tdes(k, modes.ECB(), ct, False), pt, 'SP 800-67 decrypt')
ok('TDES_SP800_67_ECB: 3-key TDEA ECB, 3 blocks')
for cnt in sorted({int(m.group(1)) for kk in C for m in [re.match(r'TDES_CBC_CAVP_TCBCMMT3_ENC_(\d+)_KEY$', kk)] if m}):
    P = f'TDES_CBC_CAVP_TCBCMMT3_ENC_{cnt}'
    k, iv, pt, ct = g(f'{P}_KEY'), g(f'{P}_IV'), g(f'{P}_PLAINTEXT'), g(f'{P}_CIPHERTEXT')
    assert len(k) == 24 and len({k[:8], k[8:16], k[16:]}) == 3, f'{P} must be 3 distinct keys'
    eq(tdes(k, modes.CBC(iv), pt), ct, f'{P} 3DES-CBC encrypt'); eq(tdes(k, modes.CBC(iv), ct, False), pt, f'{P} decrypt')
    ok(f'{P}: 3-key 3DES-CBC, {len(pt)//8} blocks')

# --- 5. ChaCha20-Poly1305 ESP (RFC 7634) ----------------------------------------
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
P = 'CHACHA_ESP_RFC7634'
km, iv, pt = g(f'{P}_KEYMAT'), g(f'{P}_IV'), g(f'{P}_PLAINTEXT'); assert len(km) == 36
aead = ChaCha20Poly1305(km[:32])
aad = struct.pack('>II', g(f'{P}_SPI'), g(f'{P}_SEQ_LO'))
eq(aead.encrypt(km[32:] + iv, pt, aad), g(f'{P}_CIPHERTEXT_ICV'), f'{P} ChaCha20-Poly1305 ESP')
check_trailer(pt, pt[:-4], 2, 4, P)
aad_esn = struct.pack('>III', g(f'{P}_SPI'), g(f'{P}_ESN_SEQ_HI'), g(f'{P}_SEQ_LO'))
eq(aead.encrypt(km[32:] + iv, pt, aad_esn)[-16:], g(f'{P}_ESN_ICV'), f'{P} with ESN')
ok(f'{P}: RFC 7634 Appendix A, and its ESN form')

unused = set(C) - used
assert not unused, f'constants not checked by verify.py: {sorted(unused)}'
print(f'ALL OK: {n_ok} vector groups, {len(C)} constants, every constant checked')
