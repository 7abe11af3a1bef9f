"""Uploaded image bytes -> uint8 (32, 32, 3) RGB, refusing what a server must not decode.

    image = decode_image(body, "image/png")                # ImageError (.status 400 or 415) when refused

Every upload is untrusted, so decoding is narrow and checked before any pixel is decoded: only PNG and JPEG, each
through its own decoder alone (the bytes must be the format the content type names; the rest of Pillow's plug-ins
never see them), the declared size checked against max_pixels before decoding (a small PNG can declare gigabytes
of pixels), anything but 32x32 refused unless `resize`, so a client never gets predictions for a silently rescaled
picture, and truncated files refused. With `resize` the image is converted exactly as
resnet_native.release.classifier.load_image does, so the server and CIFAR10Classifier.predict agree.
"""

from __future__ import annotations

import io

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
            im.load()
            pixels = load_image(im)  # RGB (alpha dropped, grey and palettes expanded), bilinear to 32x32
        except Exception as e:  # any decoder failure on untrusted bytes is the upload's fault
            raise ImageError(f"could not decode the {fmt} image ({_reason(e)})") from None
    return np.ascontiguousarray(pixels, dtype=np.uint8)


def _reason(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
