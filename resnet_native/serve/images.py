"""Uploaded image bytes -> uint8 (32, 32, 3) RGB, refusing what a server must not decode.

    image = decode_image(body, "image/png")                # ImageError (.status 400 or 415) when refused

Every upload is untrusted, so decoding is narrow and checked before any pixel is decoded: only PNG and JPEG, each
through its own decoder alone (the bytes must be the format the content type names; the rest of Pillow's plug-ins
never see them), the declared size checked against max_pixels before decoding (a small PNG can declare gigabytes
of pixels), anything but 32x32 refused unless `resize`, so a client never gets predictions for a silently rescaled
picture, and truncated files refused: a file cut short, and a whole file whose compressed data is too little for
the size its header declares (a 2048x2048 header over 8x8 of data, which Pillow would otherwise fill in silently:
check_data_size below). With `resize` the image is converted exactly as
resnet_native.release.classifier.load_image does, so the server and CIFAR10Classifier.predict agree.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

from ..release.classifier import IMAGE_SIZE, load_image

# content type -> the Pillow format its bytes must be in
CONTENT_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG"}
# Decoded pixels allowed with resize (2048 x 2048: 12 MiB as RGB); far above any sensible thumbnail upload.
DEFAULT_MAX_PIXELS = 2048 * 2048


class ImageError(ValueError):
    """An upload that is refused; `status` is the HTTP status to answer with."""

    status = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class UnsupportedImageType(ImageError):
    status = 415


def media_type(content_type) -> str:
    """'image/PNG; charset=x' -> 'image/png' ('' for None)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def check_content_type(content_type) -> str:
    """The Pillow format of a supported content type, or UnsupportedImageType (415)."""
    kind = media_type(content_type)
    if kind not in CONTENT_TYPES:
        shown = repr(kind) if kind else "none"
        raise UnsupportedImageType(f"unsupported content type {shown}: expected one of {', '.join(CONTENT_TYPES)}")
    return CONTENT_TYPES[kind]


def decode_image(data: bytes, content_type, *, resize: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS):
    """PNG or JPEG bytes -> a uint8 (32, 32, 3) RGB array; ImageError (with .status) for anything refused: 415
    for another content type, 400 for bytes that are not that format, a declared size over max_pixels, another
    size than 32x32 without `resize` (the message names it), or a truncated or corrupt file (Pillow's
    LOAD_TRUNCATED_IMAGES stays off)."""
    from PIL import Image, UnidentifiedImageError

    fmt = check_content_type(content_type)
    if not data:
        raise ImageError("empty body: expected the bytes of a PNG or JPEG image")
    try:
        im = Image.open(io.BytesIO(data), formats=[fmt])  # reads the header only
    except Image.DecompressionBombError as e:  # Pillow's own guard, far above ours, fired first
        raise ImageError(f"the image declares more pixels than this server decodes ({e})") from None
    except UnidentifiedImageError:  # its message names only Pillow's internal buffer
        raise ImageError(f"not a {fmt} image") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"not a {fmt} image ({_reason(e)})") from None
    with im:
        width, height = im.size
        if width * height > max_pixels:
            raise ImageError(f"image of {width}x{height} pixels: more than the {max_pixels} pixels this server decodes")
        if not resize and im.size != IMAGE_SIZE:
            raise ImageError(f"image of {width}x{height} pixels: expected {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} "
                             "(the server was started without --resize)")
        try:
            check_data_size(data, fmt, width, height)
        except ImageError:
            raise
        except (ValueError, IndexError, struct.error, zlib.error) as e:  # framing the checks below cannot read
            raise ImageError(f"could not decode the {fmt} image ({_reason(e)})") from None
        try:
            im.load()
            pixels = load_image(im)  # RGB (alpha dropped, grey and palettes expanded), bilinear to 32x32
        except Exception as e:  # any decoder failure on untrusted bytes is the upload's fault
            raise ImageError(f"could not decode the {fmt} image ({_reason(e)})") from None
    return np.ascontiguousarray(pixels, dtype=np.uint8)


def check_data_size(data: bytes, fmt: str, width: int, height: int) -> None:
    """ImageError (400) when the file holds less compressed data than its declared width x height needs: Pillow
    (and libjpeg, libpng) decode such a file without error, filling in the missing rows, so a header may claim
    2048x2048 over a few bytes of pixels. PNG: the IDAT stream must inflate to exactly the bytes of every row
    (Adam7 interlacing counted). JPEG (Huffman-coded, SOF0-SOF3): every 8x8 block of every component costs at least
    one bit of entropy-coded data (its DC difference, whatever the scan order), so the scans must hold at least
    blocks / 8 bytes. Arithmetic-coded JPEG has no such floor and is left to the decoder."""
    short = None
    if fmt == "PNG":
        have, need = _png_row_bytes(data, width, height)
        if have < need:
            short = f"{have} of the {need} bytes of pixel rows"
    elif fmt == "JPEG":
        found = _jpeg_scan_bytes(data)
        if found is not None:
            have, blocks = found
            if have * 8 < blocks:
                short = f"{have} bytes of coded data for {blocks} 8x8 blocks (at least {-(-blocks // 8)} needed)"
    if short is not None:
        raise ImageError(f"could not decode the {fmt} image (truncated: its header declares {width}x{height} "
                         f"pixels but the file holds {short})")


# PNG color type -> samples per pixel; Adam7 passes as (x0, y0, dx, dy)
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_row_bytes(data: bytes, width: int, height: int) -> tuple:
    """(bytes the IDAT stream inflates to, capped just past the need; bytes the declared rows need)."""
    depth, color, interlace = data[24], data[25], data[28]  # IHDR, right after the signature (Pillow checked it)
    bits = _PNG_SAMPLES.get(color, 4) * depth
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    need = 0
    for x0, y0, dx, dy in passes:
        w, h = -(-(width - x0) // dx) if width > x0 else 0, -(-(height - y0) // dy) if height > y0 else 0
        if w and h:
            need += h * (1 + -(-(w * bits) // 8))  # each row: a filter byte, then its samples
    inflate, have, pos = zlib.decompressobj(), 0, 8
    while pos + 8 <= len(data) and have <= need:
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IEND":
            break
        if kind == b"IDAT":
            chunk = data[pos + 8:pos + 8 + length]
            while chunk and have <= need and not inflate.eof:
                have += len(inflate.decompress(chunk, 1 << 20))  # bounded output per step
                chunk = inflate.unconsumed_tail
        pos += 12 + length
    return have, need


def _jpeg_scan_bytes(data: bytes):
    """(entropy-coded bytes in every scan, 8x8 blocks of every component) of a Huffman-coded JPEG; None for an
    arithmetic-coded one or one without a frame header."""
    pos, n, scan_bytes, blocks = 2, len(data), 0, None
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            raise ValueError(f"no JPEG marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:  # EOI
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        segment = data[pos + 4:pos + 2 + length]
        if marker in (0xC0, 0xC1, 0xC2, 0xC3):  # SOF, Huffman
            blocks = _jpeg_blocks(segment)
        elif 0xC5 <= marker <= 0xCF and marker not in (0xC8, 0xCC):  # SOF, differential or arithmetic
            return None
        pos += 2 + length
        if marker == 0xDA:  # SOS: entropy-coded data up to the next marker that is not a restart
            start = pos
            while (pos := data.find(b"\xff", pos)) != -1 and pos + 1 < n and (
                    data[pos + 1] == 0 or 0xD0 <= data[pos + 1] <= 0xD7):  # stuffed 0xFF or a restart marker
                pos += 2
            if pos == -1 or pos + 1 >= n:  # the file ends inside the scan
                scan_bytes += n - start
                break
            scan_bytes += pos - start
    return None if blocks is None else (scan_bytes, blocks)


def _jpeg_blocks(sof: bytes) -> int:
    """The 8x8 blocks of every component of a frame header (SOF segment): components subsampled by their sampling
    factors, not padded to whole MCUs (a lower bound on what the scans code)."""
    height, width, count = struct.unpack(">HHB", sof[1:6])
    factors = [(sof[7 + 3 * i] >> 4, sof[7 + 3 * i] & 15) for i in range(count)]
    hmax, vmax = max(h for h, _ in factors), max(v for _, v in factors)
    total = 0
    for h, v in factors:
        cw, ch = -(-width * h // hmax), -(-height * v // vmax)
        total += -(-cw // 8) * -(-ch // 8)
    return total


def _reason(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
