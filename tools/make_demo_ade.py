#!/usr/bin/env python3
"""Generate the tiny ADE20K-layout demo dataset (see mmpola/datasets/demo_ade.py).

    python tools/make_demo_ade.py                        # 200 train + 50 val, height 128, seed 0
    python tools/make_demo_ade.py --out data/tiny --num-train 8 --num-val 4 --size 64
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (the tools' shared start: repo on sys.path)

from mmpola.datasets.demo_ade import make_demo_ade  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description='Generate the ADE20K-layout demo dataset.')
    parser.add_argument('--out', default='data/demo_ade', help='dataset root')
    parser.add_argument('--num-train', type=int, default=200)
    parser.add_argument('--num-val', type=int, default=50)
    parser.add_argument('--size', type=int, default=128, help='image height in pixels')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def main():
    args = parse_args()
    meta = make_demo_ade(args.out, args.num_train, args.num_val, args.size, args.seed)
    print(f'wrote {meta["num_train"]} training and {meta["num_val"]} validation images '
          f'({len(meta["classes"])} classes + "other" = 0) to {args.out}')


if __name__ == '__main__':
    main()
