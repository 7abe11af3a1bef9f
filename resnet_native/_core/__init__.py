"""The bottom layer: the loader of the native core, streams and devices, names and validators, atomic file writes,
array placement, CUDA-graph capture and device read-backs. Imports nothing else of the package."""
