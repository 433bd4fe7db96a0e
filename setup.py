import os.path as osp

from setuptools import find_packages, setup


def read_version():
    ns = {}
    with open(osp.join(osp.dirname(__file__), 'mmpola', 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__']


setup(
    name='mmpola',
    version=read_version(),
    description='PolaFormer (polarity-aware linear attention) backbones for OpenMMLab '
    'detection, segmentation and ImageNet classification',
    long_description=open('README.md').read() if osp.exists('README.md') else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmpola', 'mmpola.*']),
    python_requires='>=3.8',
    # Known-good pins live in requirements/pins.txt (tools/setup_env.py installs them);
    # these are the loose runtime requirements for users who manage their own environment.
    install_requires=[
        'torch>=2.4', 'torchvision', 'mmengine>=0.10,<0.11', 'mmcv>=2.0.0,<2.2.0', 'mmdet>=3.3,<3.4',
        'mmsegmentation>=1.2,<1.3', 'ftfy', 'regex', 'timm>=1.0', 'einops', 'pycocotools',
    ],
    license='Apache License 2.0',
    zip_safe=False,
)
