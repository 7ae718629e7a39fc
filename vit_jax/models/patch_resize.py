"""PI-resize: a patch-embedding kernel for another patch size (FlexiViT).

FlexiViT (Beyer et al., 2023) serves every patch size with one model: a
kernel `w` made for P x P patches becomes the kernel `w'` for P' x P'
patches that gives the same embedding of a patch resized to P' x P' as `w`
gives of the original patch:

    <B x, w'> = <x, w>  for every patch x,  B: the resize P x P -> P' x P'.

That is B^T w' = w, solved in the least-squares sense, w' = pinv(B^T) w.
For P' >= P, B^T has full row rank and the equality is exact. B is the
bilinear resize FlexiViT's own code and input pipeline use (TensorFlow's
`tf.image.resize`: half-pixel centres, no antialiasing), so a released
FlexiViT checkpoint computes here what it computes in big_vision. Pure
numpy in float64: the loader resizes a file's kernel once with `pi_resize`;
a model run at another patch size than it stores (`embeddings.PatchEmbedding`)
multiplies by `pi_matrix`, a constant, in every step.
"""

import numpy as np

from vit_jax.errors import WeightsError


def bilinear_matrix(size_in: int, size_out: int) -> np.ndarray:
  """R (size_out x size_in) with out = R @ in: bilinear interpolation at
  half-pixel centres, samples beyond an edge clamped to it."""
  source = (np.arange(size_out) + 0.5) * size_in / size_out - 0.5
  lower = np.floor(source)
  frac = source - lower
  rows = np.arange(size_out)
  matrix = np.zeros((size_out, size_in))
  for tap, weight in ((lower, 1.0 - frac), (lower + 1, frac)):
    np.add.at(matrix, (rows, np.clip(tap, 0, size_in - 1).astype(int)), weight)
  return matrix


def resize_operator(old_hw, new_hw) -> np.ndarray:
  """B ((H'*W') x (H*W)): a row-major flattened H x W patch, bilinearly
  resized to H' x W' (separable: rows and columns each)."""
  return np.kron(bilinear_matrix(old_hw[0], new_hw[0]),
                 bilinear_matrix(old_hw[1], new_hw[1]))


def pi_matrix(old_hw, new_hw) -> np.ndarray:
  """M ((H'*W') x (H*W)) with w' = M w for row-major flattened kernels."""
  return np.linalg.pinv(resize_operator(old_hw, new_hw).T)


def pi_resize(kernel_PxPxCxD: np.ndarray, new_hw) -> np.ndarray:
  """The kernel (P x P x C x D, HWIO) for P' x P' patches; the same size
  returns it unchanged."""
  if kernel_PxPxCxD.ndim != 4:
    raise WeightsError(f"A patch-embedding kernel is H x W x C x D; this one "
                       f"has shape {kernel_PxPxCxD.shape}.")
  old_hw, new_hw = tuple(kernel_PxPxCxD.shape[:2]), tuple(new_hw)
  if old_hw == new_hw:
    return kernel_PxPxCxD
  flat = kernel_PxPxCxD.reshape(old_hw[0] * old_hw[1], -1).astype(np.float64)
  resized = pi_matrix(old_hw, new_hw) @ flat
  return resized.reshape(*new_hw, *kernel_PxPxCxD.shape[2:]).astype(
      kernel_PxPxCxD.dtype)
