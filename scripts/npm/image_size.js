// The size of an encoded image from its header (PNG, JPEG, GIF, BMP, WebP), as the decoders report it:
// a JPEG's EXIF orientation 5..8 swaps width and height (the engine turns the image upright). The native
// Node engine's `encodeImage` uses it for `EncodedImage.width`/`height` without decoding the pixels.

function imageError(message) {
  return Object.assign(new Error(`cannot decode the image: ${message}`), { name: "Florence2ImageError" });
}

const ascii = (b, start, end) => String.fromCharCode(...b.subarray(start, end));

/** `{width, height}` of the image in `b` (a Buffer); `Florence2ImageError` when no format matches or the
 * header is truncated. */
export function imageSize(b) {
  if (b.length >= 24 && b[0] === 0x89 && ascii(b, 1, 4) === "PNG") {
    return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
  }
  if (b.length >= 10 && (ascii(b, 0, 6) === "GIF87a" || ascii(b, 0, 6) === "GIF89a")) {
    return { width: b.readUInt16LE(6), height: b.readUInt16LE(8) };
  }
  if (b.length >= 26 && ascii(b, 0, 2) === "BM") {
    return { width: Math.abs(b.readInt32LE(18)), height: Math.abs(b.readInt32LE(22)) };
  }
  if (b.length >= 30 && ascii(b, 0, 4) === "RIFF" && ascii(b, 8, 12) === "WEBP") return webpSize(b);
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8) return jpegSize(b);
  throw imageError("not a PNG, JPEG, WebP, GIF or BMP file");
}

function webpSize(b) {
  const kind = ascii(b, 12, 16);
  if (kind === "VP8X") return { width: 1 + b.readUIntLE(24, 3), height: 1 + b.readUIntLE(27, 3) };
  if (kind === "VP8L") {
    const bits = b.readUInt32LE(21);
    return { width: 1 + (bits & 0x3fff), height: 1 + ((bits >>> 14) & 0x3fff) };
  }
  if (kind === "VP8 ") return { width: b.readUInt16LE(26) & 0x3fff, height: b.readUInt16LE(28) & 0x3fff };
  throw imageError(`WebP chunk ${JSON.stringify(kind)}`);
}

/** The frame size of the first SOF marker, turned by an APP1 EXIF orientation of 5..8. */
function jpegSize(b) {
  let off = 2;
  let orientation = 1;
  while (off + 4 <= b.length) {
    if (b[off] !== 0xff) throw imageError("a JPEG marker was expected");
    const marker = b[off + 1];
    if (marker === 0xff) {
      off++;
      continue;
    }
    const len = b.readUInt16BE(off + 2);
    const isSof = marker >= 0xc0 && marker <= 0xcf && ![0xc4, 0xc8, 0xcc].includes(marker);
    if (isSof && off + 9 <= b.length) {
      const size = { width: b.readUInt16BE(off + 7), height: b.readUInt16BE(off + 5) };
      return orientation >= 5 ? { width: size.height, height: size.width } : size;
    }
    if (marker === 0xe1 && ascii(b, off + 4, off + 10) === "Exif\0\0") {
      orientation = exifOrientation(b.subarray(off + 10, off + 2 + len)) ?? orientation;
    }
    off += 2 + len;
  }
  throw imageError("a truncated JPEG (no frame header)");
}

/** The orientation tag (0x0112) of an EXIF TIFF block, or null. */
function exifOrientation(t) {
  if (t.length < 8) return null;
  const le = ascii(t, 0, 2) === "II";
  const u16 = (o) => (le ? t.readUInt16LE(o) : t.readUInt16BE(o));
  const u32 = (o) => (le ? t.readUInt32LE(o) : t.readUInt32BE(o));
  const ifd = u32(4);
  if (ifd + 2 > t.length) return null;
  const n = u16(ifd);
  for (let i = 0; i < n; i++) {
    const e = ifd + 2 + 12 * i;
    if (e + 12 > t.length) return null;
    if (u16(e) === 0x0112) return u16(e + 8);
  }
  return null;
}
