"""Segmentation maps against their images: same size, one channel (headers only, nothing decoded)."""
import os.path as osp
import struct

from mmpola.errors import UserError

from .datasets import listing

__all__ = ['png_header', 'check_seg_maps']


_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# PNG colour type -> (channels, name)
_PNG_COLOUR = {0: (1, 'grayscale'), 2: (3, 'RGB'), 3: (1, 'palette'), 4: (2, 'grayscale + alpha'),
               6: (4, 'RGBA')}


def png_header(path):
    """``(width, height, channels, colour name)`` from a PNG's IHDR chunk (nothing decoded), or None
    when the file is no PNG."""
    with open(path, 'rb') as f:
        head = f.read(29)
    if len(head) < 29 or not head.startswith(_PNG_SIGNATURE) or head[12:16] != b'IHDR':
        return None
    width, height, _, colour = struct.unpack('>IIBB', head[16:26])
    channels, name = _PNG_COLOUR.get(colour, (None, f'colour type {colour}'))
    return width, height, channels, name


def _image_header(path):
    """``(width, height, channels, mode, transposed)`` of any image from its header (PIL opens
    lazily); ``transposed``: an EXIF orientation that decoders apply by swapping width and height."""
    header = png_header(path)
    if header is not None:
        return header + (False,)
    from PIL import Image
    try:
        with Image.open(path) as img:
            orientation = img.getexif().get(0x0112, 1) if img.format in ('JPEG', 'TIFF', 'WEBP') else 1
            return img.width, img.height, len(img.getbands()), img.mode, orientation in (5, 6, 7, 8)
    except Exception:  # unreadable: decoding errors are the pipeline's to report, naming the file
        return None


def check_seg_maps(images, seg_maps, key='dataset', root=''):
    """Each segmentation map must have its image's size and one channel (a class index per pixel).

    Today a map of another size or an RGB map trains and then crashes the evaluation with an
    ``IndexError`` that names no file. Reads only the headers (PNG IHDR; PIL's lazy open for
    images).
    """
    wrong_size, coloured = [], []
    for image, seg_map in zip(images, seg_maps):
        seg = _image_header(seg_map)
        if seg is None:
            continue
        if seg[2] is not None and seg[2] > 1:
            coloured.append(f'{_rel(seg_map, root)}: {seg[2]} channels ({seg[3]})')
        img = _image_header(image)
        if img is not None and img[:2] != seg[:2] and not (img[4] and img[1::-1] == seg[:2]):
            wrong_size.append(f'{_rel(seg_map, root)}: {seg[0]}x{seg[1]}, its image {_rel(image, root)}: '
                              f'{img[0]}x{img[1]}')
    lines = []
    if wrong_size:
        lines.append(f'{len(wrong_size)} of {len(seg_maps)} segmentation maps differ in size (width x height) from '
                     f'their image:' + listing(wrong_size) +
                     '\nFix: give each map the size of its image (resize with nearest-neighbour interpolation, '
                     'or correct which map belongs to which image)')
    if coloured:
        lines.append(f'{len(coloured)} of {len(seg_maps)} segmentation maps have several channels; a map holds one '
                     'class index per pixel:' + listing(coloured) +
                     "\nFix: save them as single-channel PNGs (mode 'L' or 'P') of class indices; convert "
                     'colour-coded maps with the palette of the dataset')
    if lines:
        raise UserError(f'{key}: ' + '\n'.join(lines))


def _rel(path, root):
    return osp.relpath(path, root) if root and path.startswith(root) else path
