"""The two numbers of the int8 rule (``schemas.layers`` states the rule and holds its
reference), apart so that its compiled kernels (``schemas.quantize_kernels``) read them
without importing the module that calls them."""

INT8_LIMIT = 127  # symmetric: -128 is never written, so negation is exact
INDEX_OFFSET = INT8_LIMIT  # the int8 columns' dictionary index of value q: q + 127
