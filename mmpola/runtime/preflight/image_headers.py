"""What an image file holds, from its header: size, channels, EXIF orientation (nothing decoded).

Shared by the checks that compare images with what describes them (COCO ``width`` / ``height``,
segmentation maps): each file is opened once, lazily (PNG: the IHDR chunk; other formats: PIL's
lazy open, which reads the header and, for JPEG, the EXIF block).
"""
import struct

__all__ = ['ImageHeader', 'png_header', 'image_header', 'applies_orientation', 'ORIENTATION_TRANSPOSES',
           'IMAGE_LOADERS']

_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# PNG colour type -> (channels, name)
_PNG_COLOUR = {0: (1, 'grayscale'), 2: (3, 'RGB'), 3: (1, 'palette'), 4: (2, 'grayscale + alpha'),
               6: (4, 'RGBA')}
# EXIF orientations that decoders apply by swapping width and height (rotations by 90 / 270 degrees)
ORIENTATION_TRANSPOSES = (5, 6, 7, 8)
# mmcv's LoadImageFromFile colour types that decode without applying the EXIF orientation (cv2's
# IMREAD_UNCHANGED and IMREAD_IGNORE_ORIENTATION; mmcv's pillow backend applies it only for
# 'color' and 'grayscale')
_IGNORE_ORIENTATION = ('unchanged', 'color_ignore_orientation', 'grayscale_ignore_orientation')
# the pipeline steps that load an image file with mmcv's LoadImageFromFile arguments (mmpola's
# LoadCheckedImage is mmcv's, with damaged JPEG data refused)
IMAGE_LOADERS = ('LoadImageFromFile', 'LoadCheckedImage')


class ImageHeader(tuple):
    """``(width, height, channels, mode, orientation)`` of a stored image; ``decoded_size(apply)``
    is the (width, height) a decoder returns when it applies the EXIF orientation (``apply``)."""

    __slots__ = ()

    def __new__(cls, width, height, channels, mode, orientation=1):
        return super().__new__(cls, (width, height, channels, mode, orientation))

    width = property(lambda self: self[0])
    height = property(lambda self: self[1])
    channels = property(lambda self: self[2])
    mode = property(lambda self: self[3])
    orientation = property(lambda self: self[4])

    @property
    def transposed(self):
        """Whether decoding (with the orientation applied) swaps width and height."""
        return self.orientation in ORIENTATION_TRANSPOSES

    def decoded_size(self, apply_orientation=True):
        if apply_orientation and self.transposed:
            return self.height, self.width
        return self.width, self.height


def png_header(path, head=None):
    """``ImageHeader`` from a PNG's IHDR chunk (nothing decoded), or None when the file is no PNG."""
    if head is None:
        with open(path, 'rb') as f:
            head = f.read(29)
    if len(head) < 29 or not head.startswith(_PNG_SIGNATURE) or head[12:16] != b'IHDR':
        return None
    width, height, _, colour = struct.unpack('>IIBB', head[16:26])
    channels, name = _PNG_COLOUR.get(colour, (None, f'colour type {colour}'))
    return ImageHeader(width, height, channels, name)


def image_header(path, pixels=False):
    """The :class:`ImageHeader` of any image (PNG: its IHDR chunk; others: PIL's lazy open), or None
    when the file is unreadable (decoding errors are the pipeline's to report, naming the file).

    ``pixels=True`` also decodes the image in the same open: returns ``(header, numpy array)``
    (``(None, None)`` when unreadable), for the checks that need the values of a sample of files.
    """
    if not pixels:
        header = png_header(path)
        if header is not None:
            return header
    from PIL import Image
    try:
        with Image.open(path) as img:
            orientation = img.getexif().get(0x0112, 1) if img.format in ('JPEG', 'TIFF', 'WEBP', 'PNG') else 1
            header = ImageHeader(img.width, img.height, len(img.getbands()), img.mode,
                                 orientation if isinstance(orientation, int) else 1)
            if pixels:
                import numpy as np
                return header, np.asarray(img)
            return header
    except Exception:  # noqa: BLE001  (unreadable: the pipeline names the file when it loads it)
        return (None, None) if pixels else None


def applies_orientation(pipeline):
    """Whether the pipeline's image loading applies the EXIF orientation (mmcv's default, 'color')."""
    for step in pipeline or []:
        if isinstance(step, dict) and str(step.get('type', '')).split('.')[-1] in IMAGE_LOADERS:
            return step.get('color_type', 'color') not in _IGNORE_ORIENTATION
    return True
