// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

const (
	plotW, plotH                       = 960, 540
	marginL, marginR, marginT, marginB = 70, 230, 40, 70
	legendX                            = plotW - marginR + 20
	pointHalf                          = 3
)

var palette = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255},
}

type series struct {
	name   string
	color  color.RGBA
	dashed bool
	ys     map[int]float64 // x index -> GB/s
}

// writePlot draws GB/s per point for the engine and its baseline, one pair of lines per op. Points sit at
// evenly spaced positions in sweep order, labelled with their size.
func writePlot(path, title string, results []*Result) error {
	var labels []string
	index := map[string]int{}
	for _, r := range results {
		l := resultLabel(r)
		if _, ok := index[l]; !ok {
			index[l] = len(labels)
			labels = append(labels, l)
		}
	}
	var all []*series
	get := func(name string, dashed bool) *series {
		for _, s := range all {
			if s.name == name {
				return s
			}
		}
		s := &series{name: name, dashed: dashed, ys: map[int]float64{}}
		s.color = palette[(len(all)/2*2+boolInt(dashed))%len(palette)]
		all = append(all, s)
		return s
	}
	ymax := 0.0
	for _, r := range results {
		x := index[resultLabel(r)]
		get(r.Engine+" "+r.Op, false).ys[x] = r.GBps
		ymax = math.Max(ymax, r.GBps)
		if b := r.Baseline; b != nil {
			get(b.Name+" "+r.Op, true).ys[x] = b.GBps
			ymax = math.Max(ymax, b.GBps)
		}
	}
	step := niceStep(ymax / 5)
	ytop := math.Ceil(ymax*1.05/step) * step
	if ytop <= 0 {
		ytop, step = 1, 0.2
	}

	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	x0, x1, y0, y1 := marginL, plotW-marginR, plotH-marginB, marginT
	grey, black := color.RGBA{220, 220, 220, 255}, color.RGBA{0, 0, 0, 255}
	px := func(i int) int {
		if len(labels) == 1 {
			return (x0 + x1) / 2
		}
		return x0 + 30 + i*(x1-x0-60)/(len(labels)-1)
	}
	py := func(v float64) int { return y0 - int(v/ytop*float64(y0-y1)) }

	for v := 0.0; v <= ytop+step/2; v += step {
		y := py(v)
		line(img, x0, y, x1, y, grey, 1, false)
		text(img, x0-8-7*len(fmt.Sprintf("%.4g", v)), y+4, fmt.Sprintf("%.4g", v), black)
	}
	line(img, x0, y0, x1, y0, black, 1, false)
	line(img, x0, y0, x0, y1, black, 1, false)
	for i, l := range labels {
		x := px(i)
		line(img, x, y0, x, y0+5, black, 1, false)
		text(img, x-7*len(l)/2, y0+20, l, black)
	}
	text(img, x0, 24, title, black)
	text(img, 8, y1-12, "GB/s", black)
	text(img, (x0+x1)/2-7*len("size per operation")/2, plotH-20, "size per operation", black)

	for k, s := range all {
		var xs []int
		for x := range s.ys {
			xs = append(xs, x)
		}
		slices.Sort(xs)
		for j, x := range xs {
			cx, cy := px(x), py(s.ys[x])
			if j > 0 {
				line(img, px(xs[j-1]), py(s.ys[xs[j-1]]), cx, cy, s.color, 2, s.dashed)
			}
			draw.Draw(img, image.Rect(cx-pointHalf, cy-pointHalf, cx+pointHalf+1, cy+pointHalf+1),
				&image.Uniform{s.color}, image.Point{}, draw.Src)
		}
		ly := marginT + 20 + k*22
		line(img, legendX, ly-4, legendX+30, ly-4, s.color, 2, s.dashed)
		text(img, legendX+38, ly, s.name, black)
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// niceStep rounds a raw tick step to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// line draws a straight line of the given width; dashed lines skip every other 6 pixels.
func line(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA, width int, dashed bool) {
	dx, dy := xb-xa, yb-ya
	n := max(abs(dx), abs(dy))
	if n == 0 {
		img.SetRGBA(xa, ya, c)
		return
	}
	for i := 0; i <= n; i++ {
		if dashed && (i/6)%2 == 1 {
			continue
		}
		x := xa + dx*i/n
		y := ya + dy*i/n
		for w := 0; w < width; w++ {
			if abs(dx) >= abs(dy) {
				img.SetRGBA(x, y+w, c)
			} else {
				img.SetRGBA(x+w, y, c)
			}
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
