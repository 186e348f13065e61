"""Everything placed on an image's patch grid: where each token looks
(:mod:`otviz.patch_grid.tokens`: the token geometry every view and metric reads), region
masks on the grid (:mod:`otviz.patch_grid.masks`: random boxes, grid cells, segments) and a
phrase's heatmap turned into a pixel box (:mod:`otviz.patch_grid.boxes`: weak grounding,
ConceptOT Sec. 2.6)."""
