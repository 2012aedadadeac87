#!/usr/bin/env python3
"""Writes an Ethernet pcap of UDP datagrams 192.168.1.10:4000 -> 192.168.2.20:5000
(the configs/algorithms pairs' protected nets), one per payload size.

Usage: make-pcap.py OUT.pcap [MIN MAX STEP]   (default 0 1472 1: IP packets of 28..1500 bytes)
No scapy needed: scripts/afalg-in-vm.sh feeds it to `espgw pcap` in the linux-peer VM.
"""
import struct
import sys


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(n, ident):
    src, dst = bytes([192, 168, 1, 10]), bytes([192, 168, 2, 20])
    payload = bytes((ident + i) & 0xFF for i in range(n))
    udp = struct.pack("!HHHH", 4000, 5000, 8 + n, 0) + payload
    csum = checksum(src + dst + struct.pack("!BBH", 0, 17, len(udp)) + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", csum) + udp[8:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), ident & 0xFFFF, 0, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    eth = bytes.fromhex("020000000101") + bytes.fromhex("02000000010a") + b"\x08\x00"
    return eth + ip + udp


def main():
    out = sys.argv[1]
    lo, hi, step = (int(a) for a in sys.argv[2:5]) if len(sys.argv) >= 5 else (0, 1472, 1)
    with open(out, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, n in enumerate(range(lo, hi + 1, step)):
            data = frame(n, i)
            f.write(struct.pack("<IIII", 1_000_000 + i // 1000, (i % 1000) * 1000, len(data), len(data)))
            f.write(data)


if __name__ == "__main__":
    main()
