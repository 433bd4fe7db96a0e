#!/usr/bin/env python3
"""Generate the small synthetic ImageNet-layout dataset of the classification demo and tests.

    python tools/make_demo_imagenet.py                     # -> data/demo_imagenet (300 train, 96 val)
    python tools/make_demo_imagenet.py --out /tmp/tiny --num-train 4 --num-val 2

Six shape classes (circle, ring, square, triangle, cross, stripes), 64x64 JPEGs in
<out>/{train,val}/<class>/; deterministic from --seed. See mmpola/classification/demo_imagenet.py.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (the tools' shared start: repo on sys.path)

from mmpola.classification.demo_imagenet import demo_imagenet_is_complete, make_demo_imagenet  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='data/demo_imagenet', help='output root (default: data/demo_imagenet)')
    parser.add_argument('--num-train', type=int, default=50, help='training images per class')
    parser.add_argument('--num-val', type=int, default=16, help='validation images per class')
    parser.add_argument('--size', type=int, default=64, help='image side in pixels')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--overwrite', action='store_true', help='regenerate even if the dataset exists')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if demo_imagenet_is_complete(args.out) and not args.overwrite:
        print(f'{args.out} already holds a complete demo dataset (use --overwrite to regenerate)')
    meta = make_demo_imagenet(args.out, num_train=args.num_train, num_val=args.num_val, size=args.size,
                              seed=args.seed, overwrite=args.overwrite)
    print(f"{args.out}: {meta['images']['train']} train / {meta['images']['val']} val images, "
          f"classes {', '.join(meta['classes'])}")


if __name__ == '__main__':
    main()
