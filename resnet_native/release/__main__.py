"""python -m resnet_native.release: see resnet_native/release/build.py."""

from .build import main

if __name__ == "__main__":
    main()
