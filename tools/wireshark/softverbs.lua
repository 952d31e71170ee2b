--[[
softverbs.lua -- Wireshark/tshark postdissector for RoCE v2 (softverbs project)

Wireshark's own InfiniBand dissector (checked with 4.0.17) decodes RoCE v2 on UDP port
4791, but it names the XRC opcodes without parsing their XRCETH, and it never checks the
ICRC. This script adds both, as a postdissector that runs after the built-in dissectors:

  softverbs.xrceth.srqn       XRC SRQ number from the XRCETH of XRC request packets
                              (opcodes 0xA0-0xB7 except the responses 0xAD-0xB2 and the
                              reserved 0xB5; XRC responses carry no XRCETH)
  softverbs.xrceth.reserved   the XRCETH's reserved top byte
  softverbs.icrc              ICRC read from the packet (little-endian on the wire)
  softverbs.icrc.computed     ICRC recomputed over the invariant fields
  softverbs.icrc.status       "good" or "bad" (a bad one also raises the expert error
                              softverbs.icrc.bad, group Checksum)
  softverbs.icrc.unchecked    why the ICRC could not be checked (truncated capture,
                              IPv6 extension headers, ...), expert warning
                              softverbs.icrc.unchecked

Every field is filterable, e.g.
  softverbs.icrc.status == "bad"
  softverbs.xrceth.srqn == 0x123

Usage
  tshark:    tshark -X lua_script:tools/wireshark/softverbs.lua -r cap.pcap
             tshark -X lua_script:tools/wireshark/softverbs.lua -r cap.pcap \
                    -Y 'softverbs.icrc.status == "bad"'
             tshark -X lua_script:tools/wireshark/softverbs.lua -r cap.pcap -T fields \
                    -e frame.number -e softverbs.icrc.status -e softverbs.xrceth.srqn
  GUI:       copy this file into the personal Lua plugins folder
             (Linux: ~/.local/lib/wireshark/plugins/, see Help > About > Folders), then
             restart Wireshark or use Analyze > Reload Lua Plugins.
  Port:      Edit > Preferences > Protocols > SOFTVERBS (or -o softverbs.udp_port:N);
             RoCE v2 always uses 4791.

Known Wireshark 4.0 quirk (not this script): the RPC-over-RDMA heuristic claims SEND
payloads shorter than 16 bytes (including empty ones) and flags them "[Malformed Packet:
RPCoRDMA]". softverbs traffic is not RPC-over-RDMA; add --disable-protocol rpcordma (or
untick it under Analyze > Enabled Protocols) to avoid the false alarm.

Needs a Wireshark built with Lua (Debian/Ubuntu "tshark"/"wireshark" packages are).
Works with Lua 5.1/5.2 (bit32) and 5.3/5.4 (native integer operators).
When Wireshark runs as root, init.lua's run_user_scripts_when_superuser must be true
(it is by default since 2.x); tshark then only prints a warning.

ICRC definition (RoCE v2, IBA 7.8.1 + Annex A17; softverbs reference §A1.7): CRC-32 as
in Ethernet/zlib (reflected polynomial 0xEDB88320, initial value and final xor
0xFFFFFFFF) over
    8 bytes 0xFF (the absent LRH) | IP header | UDP header | BTH | ETHs | payload | pad
with the variant fields replaced by all-ones first: IPv4 TOS, TTL and header checksum;
IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH byte 4 (FECN, BECN,
Resv6a). The 32-bit result is stored little-endian in the last 4 bytes of the UDP payload.
The UDP length (not the frame length) bounds the packet, so Ethernet padding and a
captured FCS are ignored.
--]]

local VERSION = "0.1.0"

if set_plugin_info then
    set_plugin_info({
        version = VERSION,
        description = "RoCE v2 XRCETH decoding and ICRC verification (softverbs)",
    })
end

---------------------------------------------------------------------------------------
-- 32-bit operations that work on Lua 5.1/5.2 (bit32 library) and 5.3+ (integers).

local band, bxor, rshift
if bit32 then
    band, bxor, rshift = bit32.band, bit32.bxor, bit32.rshift
else
    -- Compiled at run time so that Lua 5.2 never parses the 5.3 operators.
    band, bxor, rshift = load([[
        return function(a, b) return a & b end,
               function(a, b) return a ~ b end,
               function(a, n) return (a & 0xFFFFFFFF) >> n end
    ]])()
end

local CRC_POLY = 0xEDB88320
local crc_table = {}
for n = 0, 255 do
    local c = n
    for _ = 1, 8 do
        if band(c, 1) == 1 then
            c = bxor(rshift(c, 1), CRC_POLY)
        else
            c = rshift(c, 1)
        end
    end
    crc_table[n] = c
end

-- Feeds one byte value into the CRC register.
local function crc_byte(reg, b)
    return bxor(crc_table[band(bxor(reg, b), 0xFF)], rshift(reg, 8))
end

-- Feeds bytes first..last of the Lua string s into the CRC register.
local sbyte = string.byte
local function crc_string(reg, s, first, last)
    local t = crc_table
    for k = first, last do
        reg = bxor(t[band(bxor(reg, sbyte(s, k)), 0xFF)], rshift(reg, 8))
    end
    return reg
end

---------------------------------------------------------------------------------------
-- Protocol, fields, expert infos, preferences.

local ROCE_V2_PORT = 4791
local BTH_LEN = 12
local XRCETH_LEN = 4
local ICRC_LEN = 4
local UDP_LEN = 8
local BTH_VARIANT_BYTE = 4 -- FECN | BECN | Resv6a

local proto = Proto("softverbs", "softverbs RoCE v2 checks (XRCETH, ICRC)")

local pf = {
    xrceth_reserved = ProtoField.uint8("softverbs.xrceth.reserved", "XRCETH reserved", base.HEX),
    xrceth_srqn = ProtoField.uint24("softverbs.xrceth.srqn", "XRC SRQ Number", base.HEX),
    icrc = ProtoField.uint32("softverbs.icrc", "ICRC (from packet)", base.HEX),
    icrc_computed = ProtoField.uint32("softverbs.icrc.computed", "ICRC (computed)", base.HEX),
    icrc_status = ProtoField.string("softverbs.icrc.status", "ICRC status"),
    icrc_unchecked = ProtoField.string("softverbs.icrc.unchecked", "ICRC not checked"),
}
proto.fields = {
    pf.xrceth_reserved, pf.xrceth_srqn, pf.icrc, pf.icrc_computed, pf.icrc_status,
    pf.icrc_unchecked,
}

local ex_bad = ProtoExpert.new("softverbs.icrc.bad", "Bad RoCE v2 ICRC",
    expert.group.CHECKSUM, expert.severity.ERROR)
local ex_unchecked = ProtoExpert.new("softverbs.icrc.unchecked.expert",
    "RoCE v2 ICRC not checked", expert.group.PROTOCOL, expert.severity.WARN)
proto.experts = { ex_bad, ex_unchecked }

proto.prefs.udp_port = Pref.uint("UDP destination port", ROCE_V2_PORT,
    "UDP destination port of RoCE v2 traffic (IANA: 4791)")

-- Field extractors locate the (innermost) IP and UDP headers in the frame, so VLAN tags,
-- Linux cooked captures and tunnels need no offset arithmetic here.
local fx_ip = Field.new("ip")
local fx_ipv6 = Field.new("ipv6")
local fx_udp_dst = Field.new("udp.dstport")

---------------------------------------------------------------------------------------
-- XRC opcodes: 0xA0 | (RC operation). Requests carry an XRCETH right after BTH;
-- the responses (READ RESPONSE First/Middle/Last/Only, ACK, ATOMIC ACK = 0x0D..0x12)
-- do not. 0x15 and 0x18..0x1F are reserved.
local function is_xrc_request(opcode)
    if opcode < 0xA0 or opcode > 0xB7 then
        return false
    end
    local op = opcode - 0xA0
    return not ((op >= 0x0D and op <= 0x12) or op == 0x15)
end

-- The innermost IP header that starts before udp_off: offset and version, or nil.
local function ip_header_before(udp_off)
    local best, version = nil, nil
    for _, fi in ipairs({ fx_ip() }) do
        if fi.offset < udp_off and (best == nil or fi.offset > best) then
            best, version = fi.offset, 4
        end
    end
    for _, fi in ipairs({ fx_ipv6() }) do
        if fi.offset < udp_off and (best == nil or fi.offset > best) then
            best, version = fi.offset, 6
        end
    end
    return best, version
end

-- ICRC register after 8 x 0xFF (the masked LRH).
local CRC_AFTER_LRH = 0xFFFFFFFF
for _ = 1, 8 do
    CRC_AFTER_LRH = crc_byte(CRC_AFTER_LRH, 0xFF)
end

-- Computes the ICRC of the RoCE v2 packet whose IP header starts at ip_off, UDP header
-- at udp_off, and whose ICRC starts at icrc_off (all offsets in tvb).
local function compute_icrc(tvb, ip_version, ip_off, udp_off, icrc_off)
    -- Masked copy of IP header, UDP header and BTH as a byte array.
    local hdr_len = udp_off - ip_off + UDP_LEN + BTH_LEN
    local h = { sbyte(tvb:raw(ip_off, hdr_len), 1, hdr_len) }
    -- Lua arrays are 1-based: h[k + 1] is byte k of the IP header.
    if ip_version == 4 then
        h[2] = 0xFF               -- TOS (DSCP, ECN)
        h[9] = 0xFF               -- TTL
        h[11], h[12] = 0xFF, 0xFF -- header checksum
    else
        h[1] = h[1] - (h[1] % 16) + 0x0F -- keep version, traffic class high nibble = 1s
        h[2], h[3], h[4] = 0xFF, 0xFF, 0xFF -- traffic class low nibble, flow label
        h[8] = 0xFF               -- hop limit
    end
    local u = udp_off - ip_off    -- UDP header index (0-based)
    h[u + 7], h[u + 8] = 0xFF, 0xFF                  -- UDP checksum
    h[u + UDP_LEN + BTH_VARIANT_BYTE + 1] = 0xFF      -- BTH FECN/BECN/Resv6a

    local reg = CRC_AFTER_LRH
    for k = 1, hdr_len do
        reg = crc_byte(reg, h[k])
    end
    local rest_off = ip_off + hdr_len
    local rest_len = icrc_off - rest_off
    if rest_len > 0 then
        reg = crc_string(reg, tvb:raw(rest_off, rest_len), 1, rest_len)
    end
    return bxor(reg, 0xFFFFFFFF)
end

---------------------------------------------------------------------------------------

function proto.dissector(tvb, pinfo, tree)
    -- Find the last UDP header in the frame whose destination port is RoCE v2's.
    local port = proto.prefs.udp_port
    local udp_off = nil
    for _, fi in ipairs({ fx_udp_dst() }) do
        if fi.value == port then
            udp_off = fi.offset - 2
        end
    end
    if udp_off == nil or udp_off < 0 or udp_off + UDP_LEN > tvb:len() then
        return
    end
    -- Guard against offsets that belong to another data source (reassembly, decryption).
    if tvb(udp_off + 2, 2):uint() ~= port then
        return
    end
    local ip_off, ip_version = ip_header_before(udp_off)
    if ip_off == nil or band(rshift(tvb(ip_off, 1):uint(), 4), 0x0F) ~= ip_version then
        return
    end

    local udp_len = tvb(udp_off + 4, 2):uint()
    local ib_off = udp_off + UDP_LEN
    local ib_end = udp_off + udp_len -- one past the ICRC
    local t = tree:add(proto, tvb(ib_off, math.max(0, math.min(tvb:len(), ib_end) - ib_off)))

    local function unchecked(why)
        t:add(pf.icrc_unchecked, why):set_generated()
        t:add_proto_expert_info(ex_unchecked, "RoCE v2 ICRC not checked: " .. why)
    end

    if udp_len < UDP_LEN + BTH_LEN + ICRC_LEN then
        unchecked("UDP payload shorter than BTH + ICRC")
        return
    end
    if ib_off + BTH_LEN > tvb:len() then
        unchecked("capture ends inside BTH")
        return
    end

    -- XRCETH
    local opcode = tvb(ib_off, 1):uint()
    if is_xrc_request(opcode) then
        local x_off = ib_off + BTH_LEN
        if x_off + XRCETH_LEN <= math.min(tvb:len(), ib_end - ICRC_LEN) then
            local xt = t:add(tvb(x_off, XRCETH_LEN), "XRC Extended Transport Header (XRCETH)")
            xt:add(pf.xrceth_reserved, tvb(x_off, 1))
            xt:add(pf.xrceth_srqn, tvb(x_off + 1, 3))
            local srqn = tvb(x_off + 1, 3):uint()
            xt:append_text(string.format(", XRCSRQ: 0x%06x", srqn))
            pinfo.cols.info:append(string.format(" XRCSRQ=0x%06x", srqn))
        else
            t:add(tvb(ib_off, BTH_LEN), "XRCETH missing: packet too short")
        end
    end

    -- ICRC
    if ib_end > tvb:len() then
        unchecked("capture shorter than the UDP length (snaplen?)")
        return
    end
    if ip_version == 6 and udp_off - ip_off ~= 40 then
        unchecked("IPv6 extension headers present")
        return
    end
    if ip_version == 4 and udp_off - ip_off ~= 4 * band(tvb(ip_off, 1):uint(), 0x0F) then
        unchecked("IPv4 header length does not reach the UDP header")
        return
    end
    local icrc_off = ib_end - ICRC_LEN
    local wire = tvb(icrc_off, ICRC_LEN):le_uint()
    local computed = compute_icrc(tvb, ip_version, ip_off, udp_off, icrc_off)
    local ct = t:add_le(pf.icrc, tvb(icrc_off, ICRC_LEN))
    t:add(pf.icrc_computed, tvb(icrc_off, ICRC_LEN), computed):set_generated()
    if wire == computed then
        ct:append_text(" [good]")
        t:add(pf.icrc_status, tvb(icrc_off, ICRC_LEN), "good"):set_generated()
    else
        ct:append_text(" [bad]")
        local st = t:add(pf.icrc_status, tvb(icrc_off, ICRC_LEN), "bad")
        st:set_generated()
        st:add_proto_expert_info(ex_bad, string.format(
            "Bad RoCE v2 ICRC: packet has 0x%08x, computed 0x%08x", wire, computed))
        pinfo.cols.info:append(" [BAD ICRC]")
    end
end

register_postdissector(proto)
