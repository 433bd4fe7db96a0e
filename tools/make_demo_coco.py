#!/usr/bin/env python3
"""Generate the small synthetic COCO-format instance dataset used by the demo configs.

    python tools/make_demo_coco.py                      # -> data/demo_coco (320 train, 64 val)
    python tools/make_demo_coco.py --out /tmp/tiny --num-train 8 --num-val 4

Shapes (circle, rectangle, triangle) on textured noisy backgrounds, polygon masks plus a few
iscrowd RLE annotations; deterministic from --seed. See mmpola/datasets/demo_coco.py.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (the tools' shared start: repo on sys.path)

from mmpola.datasets.demo_coco import demo_coco_is_complete, make_demo_coco  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='data/demo_coco', help='output root (default: data/demo_coco)')
    parser.add_argument('--num-train', type=int, default=320)
    parser.add_argument('--num-val', type=int, default=64)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--overwrite', action='store_true', help='regenerate even if the dataset exists')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if demo_coco_is_complete(args.out) and not args.overwrite:
        print(f'{args.out} already holds a complete demo dataset (use --overwrite to regenerate)')
    files = make_demo_coco(args.out, num_train=args.num_train, num_val=args.num_val, seed=args.seed,
                           overwrite=args.overwrite)
    print('annotations:', ', '.join(files.values()))


if __name__ == '__main__':
    main()
